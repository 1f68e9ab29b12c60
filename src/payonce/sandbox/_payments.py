"""The provider's payments API: each payment executes at most once per idempotency key.

Faults and the key's contract (replay, 409 in flight, refused mismatch) are the shared
``KeyGuard``'s; a claimed key executes one payment here, and the payment, its count and its
answer are recorded together, so no fault can leave half of them behind.
"""

from __future__ import annotations

from typing import Final

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._dialects import payment_answer
from payonce.sandbox._errors import ApiError
from payonce.sandbox._guard import KeyGuard
from payonce.sandbox._requests import (
    PaymentRequest,
    authenticate,
    forced_fault,
    idempotency_key,
    is_form,
    metadata_query,
)
from payonce.sandbox._store import Claimed, Payment, SandboxStore, StoredResponse, new_payment_id
from payonce.sandbox._webhooks import WebhookSender

DECLINE_AMOUNT: Final = 40200


@attrs.frozen
class PaymentsApi:
    """``/v1/payments``: create a payment under a key, find it by id, key, reference or metadata."""

    config: SandboxConfig
    store: SandboxStore
    guard: KeyGuard
    webhooks: WebhookSender | None

    async def create_payment(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        key = idempotency_key(request, self.config.key_header)
        forced = forced_fault(request)
        form = self.config.form_bodies and is_form(request)
        params = PaymentRequest.parse(await request.body(), form=form)
        # Only well-formed requests draw faults, so a 400 never shifts a seeded run.
        plan = await self.guard.faults_before(forced)
        claim = await self.guard.claim(account, key, params.fingerprint())
        if not isinstance(claim, Claimed):
            return claim  # the stored answer, replayed
        stored = await self.guard.execute(
            account, key, claim, lambda: self._record(account, key, claim, params)
        )
        return self.guard.faults_after(plan, stored)

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
