"""The provider's payments API: each payment executes at most once per idempotency key.

A request draws its faults first, then claims its key: a key already completed replays the
stored answer byte for byte, one in flight answers 409, one reused with other parameters is
refused. Only a claimed key executes, and the execution, its count and its answer are
recorded together, so no fault can leave half of them behind.
"""

from __future__ import annotations

import asyncio
from typing import Final

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._dialects import key_message, mismatch_status, payment_answer
from payonce.sandbox._errors import ApiError, DroppedResponse
from payonce.sandbox._faults import FaultInjector
from payonce.sandbox._requests import (
    PaymentRequest,
    authenticate,
    forced_fault,
    idempotency_key,
    is_form,
    metadata_query,
)
from payonce.sandbox._store import (
    Claimed,
    ClaimResult,
    InProgress,
    Mismatch,
    Payment,
    Replay,
    SandboxStore,
    StoredResponse,
    new_payment_id,
)
from payonce.sandbox._webhooks import WebhookSender

DECLINE_AMOUNT: Final = 40200
_UNGUARDED: Final = "unguarded"
"""The claim token of an execution no key guards: it completes or releases no key's row."""


def _retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


def _stored(stored: StoredResponse, *, replayed: bool = False) -> Response:
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return Response(stored.body, stored.status, headers, media_type="application/json")


@attrs.frozen
class PaymentsApi:
    """``/v1/payments``: create a payment under a key, find it by id, key, reference or metadata."""

    config: SandboxConfig
    store: SandboxStore
    injector: FaultInjector
    webhooks: WebhookSender | None

    def _key_error(self, status: int, type_: str, message: str, key: str) -> ApiError:
        return ApiError(status, type_, key_message(self.config.dialect, type_, key, message))

    async def create_payment(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        key = idempotency_key(request, self.config.key_header)
        forced = forced_fault(request)
        form = self.config.form_bodies and is_form(request)
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

        claim = await self._claim(account, key, params)
        if isinstance(claim, Replay):
            return _stored(claim.response, replayed=True)
        if isinstance(claim, Mismatch):
            status = self.config.mismatch_status or mismatch_status(self.config.dialect)
            message = "this key was used with different parameters"
            raise self._key_error(status, "idempotency_key_mismatch", message, key)
        if isinstance(claim, InProgress):
            message = "a request with this key is in flight"
            raise self._key_error(409, "idempotency_key_in_use", message, key)

        stored = await self._execute(account, key, claim, params)
        if plan.fail_after:
            raise ApiError(503, "service_unavailable", "the service is unavailable")
        if plan.drop_after:
            return DroppedResponse(stored)
        return _stored(stored)

    async def _claim(self, account: str, key: str, params: PaymentRequest) -> ClaimResult:
        if self.config.idempotency == "none":
            return Claimed(_UNGUARDED)  # every request executes
        claim = await run_in_threadpool(
            self.store.claim, account, key, params.fingerprint(), self.config.key_lifetime
        )
        if isinstance(claim, InProgress) and self.config.idempotency == "racy":
            # The flaw some servers have: only a completed key is a duplicate, so one that
            # arrives while the first still runs executes as well.
            return Claimed(_UNGUARDED)
        return claim

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
        payment = Payment(
            id=new_payment_id(),
            account=account,
            amount=params.amount,
            currency=params.currency,
            reference=params.reference,
            status="failed" if params.amount == DECLINE_AMOUNT else "succeeded",
            idempotency_key=key,
            metadata=params.metadata,
            created_at=self.store.clock.now(),
        )
        response = payment_answer(self.config.dialect, payment)
        self.store.record_execution(claim.token, payment, response)
        if self.webhooks is not None:
            self.webhooks.enqueue(payment)
        return response

    async def get_payment(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        payment_id = request.path_params["payment_id"]
        payment = await run_in_threadpool(self.store.find_payment, account, payment_id)
        if payment is None:
            raise ApiError(404, "not_found", f"no such payment: {payment_id}")
        return JSONResponse(payment.to_json())

    async def list_payments(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        key = request.query_params.get("idempotency_key")
        reference = request.query_params.get("reference")
        if key is None and reference is None:
            raise ApiError(400, "invalid_request", "give idempotency_key or reference")
        found = await run_in_threadpool(
            lambda: self.store.find_payments(account, idempotency_key=key, reference=reference)
        )
        return JSONResponse({"object": "list", "data": [p.to_json() for p in found]})

    async def search_payments(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        name, value = metadata_query(request.query_params.get("query", ""))
        found = await run_in_threadpool(self.store.search_metadata, account, name, value)
        return JSONResponse(
            {
                "object": "search_result",
                "data": [p.to_json() for p in found],
                "has_more": False,
                "url": "/v1/payments/search",
            }
        )
