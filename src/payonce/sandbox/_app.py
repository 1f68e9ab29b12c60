"""The sandbox provider's HTTP API, faithful to the server side of the Idempotency-Key contract."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, TypeGuard

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

DEFAULT_API_KEY: Final = "sk_test_payonce"
DEFAULT_ACCOUNT: Final = "acct_demo"
DECLINE_AMOUNT: Final = 40200
MAX_KEY_LENGTH: Final = 255
_MAX_AMOUNT: Final = 10**12  # keeps amounts inside SQLite's 64-bit integers
_PAYMENT_FIELDS: Final = frozenset({"amount", "currency", "reference", "metadata"})


def _default_api_keys() -> dict[str, str]:
    return {DEFAULT_API_KEY: DEFAULT_ACCOUNT}


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be non-negative, got {value!r}")


@attrs.frozen
class SandboxConfig:
    api_keys: Mapping[str, str] = attrs.field(factory=_default_api_keys)
    key_lifetime: float = attrs.field(default=24 * 3600.0, validator=_non_negative)
    processing_seconds: float = attrs.field(default=0.0, validator=_non_negative)
    faults: Faults = attrs.field(factory=Faults)
    store_path: str | None = None


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


def _error(status: int, type_: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": type_, "message": message}}, status)


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


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        raise ApiError(400, "invalid_request", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "request body must be a JSON object")
    return data


def _is_currency(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 3 and value.isascii() and value.isalpha()


@attrs.frozen
class PaymentRequest:
    amount: int
    currency: str
    reference: str | None
    metadata: Mapping[str, Any]

    @classmethod
    def parse(cls, body: bytes) -> PaymentRequest:
        data = _json_object(body)
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


def _idempotency_key(request: Request) -> str:
    key = request.headers.get("idempotency-key", "")
    # Accept the RFC 8941 sf-string form ("abc") as well as the bare value.
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key:
        raise ApiError(400, "idempotency_key_missing", "an Idempotency-Key header is required")
    if len(key) > MAX_KEY_LENGTH:
        raise ApiError(400, "invalid_request", f"Idempotency-Key exceeds {MAX_KEY_LENGTH} chars")
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
        self._owns_store = owns_store
        _silence_injected_drops()
        self.app = Starlette(
            routes=[
                Route("/v1/payments", self._create_payment, methods=["POST"]),
                Route("/v1/payments", self._list_payments, methods=["GET"]),
                Route("/v1/payments/{payment_id}", self._get_payment, methods=["GET"]),
                Route("/_sandbox/executions", self._executions, methods=["GET"]),
                Route("/_sandbox/script", self._script, methods=["POST"]),
                Route("/_sandbox/faults", self._faults, methods=["POST"]),
                Route("/_sandbox/clock", self._clock, methods=["POST"]),
                Route("/_sandbox/reset", self._reset, methods=["POST"]),
            ],
            middleware=[Middleware(_RequestIdMiddleware)],
            exception_handlers={ApiError: _api_error, HTTPException: _http_error},
            lifespan=self._lifespan,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        if self._owns_store:
            self.store.close()

    def reset(self) -> None:
        self.store.reset()
        self.injector.reset(self.config.faults)

    def _authenticate(self, request: Request) -> str:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        account = self.config.api_keys.get(token.strip()) if scheme.lower() == "bearer" else None
        if account is None:
            raise ApiError(
                401, "authentication_error", "invalid API key", {"WWW-Authenticate": "Bearer"}
            )
        return account

    async def _create_payment(self, request: Request) -> Response:
        account = self._authenticate(request)
        key = _idempotency_key(request)
        forced = _forced_fault(request)
        params = PaymentRequest.parse(await request.body())
        # Only well-formed requests draw faults, so a 400 never shifts a seeded run.
        plan = self.injector.plan(forced)
        faults = self.injector.faults
        if plan.rate_limit:
            retry_after = _retry_after(faults.retry_after_seconds)
            raise ApiError(429, "rate_limit", "too many requests", {"Retry-After": retry_after})
        if plan.fail_before:
            raise ApiError(503, "service_unavailable", "the service is unavailable")
        if plan.delay and faults.delay_seconds > 0:
            await asyncio.sleep(faults.delay_seconds)

        claim = await run_in_threadpool(
            self.store.claim, account, key, params.fingerprint(), self.config.key_lifetime
        )
        if isinstance(claim, Replay):
            return _stored(claim.response, replayed=True)
        if isinstance(claim, Mismatch):
            raise ApiError(
                422, "idempotency_key_mismatch", "this key was used with different parameters"
            )
        if isinstance(claim, InProgress):
            raise ApiError(409, "idempotency_key_in_use", "a request with this key is in flight")

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
        if declined:
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

    async def _reset(self, request: Request) -> Response:
        await run_in_threadpool(self.reset)
        return JSONResponse({"reset": True})


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    response = _error(exc.status, exc.type, exc.message)
    response.headers.update(exc.headers)
    return response


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
