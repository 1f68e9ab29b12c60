"""The payment resources Adyen's, Mollie's and Square's Python SDKs call, in their dialects.

- Adyen (Checkout API): ``POST /v{n}/payments`` (``amount: {value, currency}``,
  ``reference``, ``merchantAccount``; answered 200 with a ``resultCode``) and ``POST
  /v{n}/payments/{pspReference}/captures``; the key in ``Idempotency-Key``, optional.
- Mollie: ``POST /v2/payments`` (``amount: {currency, value: "10.00"}``, ``description``)
  and ``GET /v2/payments/{id}``; the key in ``Idempotency-Key``, optional. The hosted
  checkout is skipped: a payment is ``paid`` (or ``failed``) at once.
- Square: ``POST /v2/payments`` with the key in the JSON body's ``idempotency_key``
  (required), ``GET /v2/payments/{id}``, ``GET /v2/payments``, ``POST
  /v2/payments/{id}/complete`` (for a payment made with ``autocomplete: false``) and ``POST
  /v2/payments/cancel`` (cancel by the key a payment was created under).

Every mutating request runs through the shared ``KeyGuard`` (faults first, then the key:
the same key and body replay the first answer, another body is refused as the dialect
words it, one in flight gets 409), and each execution is counted under its key (``""``
for a request without one, which executes every time, as on these providers). An amount
of 40200 is declined, as on the sandbox's own payments.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._dialects import dumps
from payonce.sandbox._errors import ApiError
from payonce.sandbox._guard import UNGUARDED, KeyGuard
from payonce.sandbox._payments import DECLINE_AMOUNT
from payonce.sandbox._requests import authenticate, forced_fault, idempotency_key, json_object
from payonce.sandbox._store import Claimed, Payment, SandboxStore, StoredResponse, new_payment_id

SQUARE_KEY_FIELD: Final = "idempotency_key"
_MAX_AMOUNT: Final = 10**12
_MOLLIE_VALUE: Final = re.compile(r"\d{1,12}\.\d{2}")
_ADYEN_VERSION: Final = re.compile(r"v\d{1,3}")
_SQUARE_STATUS: Final[Mapping[str, str]] = {
    "authorized": "APPROVED",
    "succeeded": "COMPLETED",
    "failed": "FAILED",
}


def _fingerprint(endpoint: str, body: Mapping[str, Any]) -> str:
    canonical = json.dumps([endpoint, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _currency(value: object, field: str, status: int) -> str:
    if not (isinstance(value, str) and len(value) == 3 and value.isascii() and value.isalpha()):
        raise ApiError(status, "invalid_request", f"{field} must be a 3-letter currency code")
    return value.upper()


def _minor_units(value: object, field: str, status: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < _MAX_AMOUNT:
        raise ApiError(status, "invalid_request", f"{field} must be a positive integer")
    return value


def _text(data: Mapping[str, Any], field: str, status: int, *, required: bool) -> str | None:
    value = data.get(field)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ApiError(status, "invalid_request", f"{field} is required and must be a string")
    return value


def _metadata(data: Mapping[str, Any], status: int) -> dict[str, Any]:
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ApiError(status, "invalid_request", "metadata must be an object")
    return metadata


@attrs.frozen
class SdkPaymentsApi:
    """The SDK-facing payment resources of one dialect, over the sandbox's payments table."""

    config: SandboxConfig
    store: SandboxStore
    guard: KeyGuard

    def routes(self) -> list[Route]:
        if self.config.dialect == "adyen":
            return [
                Route("/{version}/payments", self.adyen_payment, methods=["POST"]),
                Route("/{version}/payments/{psp}/captures", self.adyen_capture, methods=["POST"]),
            ]
        if self.config.dialect == "mollie":
            return [
                Route("/v2/payments", self.mollie_create, methods=["POST"]),
                Route("/v2/payments/{payment_id}", self.mollie_get, methods=["GET"]),
            ]
        if self.config.dialect == "square":
            return [
                Route("/v2/payments", self.square_create, methods=["POST"]),
                Route("/v2/payments", self.square_list, methods=["GET"]),
                Route("/v2/payments/cancel", self.square_cancel_by_key, methods=["POST"]),
                Route("/v2/payments/{payment_id}", self.square_get, methods=["GET"]),
                Route("/v2/payments/{payment_id}/complete", self.square_complete, methods=["POST"]),
            ]
        return []

    # -- shared ----------------------------------------------------------------------------

    def _header_key(self, request: Request) -> str | None:
        if self.config.key_header.lower() not in request.headers:
            return None
        return idempotency_key(request, self.config.key_header)

    async def _run(
        self,
        request: Request,
        account: str,
        key: str | None,
        fingerprint: str,
        record: Callable[[Claimed], StoredResponse],
    ) -> Response:
        """Faults, the key's claim, the execution and the faults after it, as for every
        mutating endpoint of the sandbox."""
        plan = await self.guard.faults_before(forced_fault(request))
        claim: Claimed | Response = Claimed(UNGUARDED)
        if key is not None:
            claim = await self.guard.claim(account, key, fingerprint)
        if not isinstance(claim, Claimed):
            return claim  # the stored answer, replayed
        stored = await self.guard.execute(account, key or "", claim, lambda: record(claim))
        return self.guard.faults_after(plan, stored)

    def _new_payment(
        self, account: str, key: str | None, amount: int, currency: str, **about: Any
    ) -> Payment:
        declined = amount == DECLINE_AMOUNT
        payment_id = new_payment_id()
        if self.config.dialect == "mollie":
            # mollie-api-python refuses a payment id that does not start with tr_.
            payment_id = "tr_" + payment_id.removeprefix("pay_")
        return Payment(
            id=payment_id,
            account=account,
            amount=amount,
            currency=currency,
            reference=about.get("reference"),
            status="failed" if declined else about.get("status", "succeeded"),
            idempotency_key=key or "",
            metadata=about.get("metadata", {}),
            created_at=self.store.clock.now(),
        )

    async def _find(self, account: str, payment_id: str) -> Payment:
        payment = await run_in_threadpool(self.store.find_payment, account, payment_id)
        if payment is None:
            raise ApiError(404, "not_found", f"no such payment: {payment_id}")
        return payment

    # -- Adyen -----------------------------------------------------------------------------

    @staticmethod
    def _adyen_version(request: Request) -> str:
        version = str(request.path_params["version"])
        if not _ADYEN_VERSION.fullmatch(version):
            raise ApiError(404, "not_found", f"no such API version: {version}")
        return version

    async def adyen_payment(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        version = self._adyen_version(request)
        key = self._header_key(request)
        data = json_object(await request.body())
        amount = data.get("amount")
        if not isinstance(amount, dict):
            raise ApiError(422, "validation", "Required field 'amount' is not provided.")
        value = _minor_units(amount.get("value"), "amount.value", 422)
        currency = _currency(amount.get("currency"), "amount.currency", 422)
        reference = _text(data, "reference", 422, required=True)
        _text(data, "merchantAccount", 422, required=True)
        metadata = _metadata(data, 422)

        def record(claim: Claimed) -> StoredResponse:
            payment = self._new_payment(
                account, key, value, currency, reference=reference, metadata=metadata
            )
            refused = payment.status == "failed"
            body = {
                "pspReference": payment.id,
                "resultCode": "Refused" if refused else "Authorised",
                "merchantReference": reference,
                "amount": {"value": value, "currency": currency},
                **({"refusalReason": "Refused"} if refused else {}),
            }
            # Adyen answers a refusal with 200 too: the outcome is in resultCode.
            response = StoredResponse(200, dumps(body))
            self.store.record_execution(claim.token, payment, response)
            return response

        endpoint = f"POST /{version}/payments"
        return await self._run(request, account, key, _fingerprint(endpoint, data), record)

    async def adyen_capture(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        version = self._adyen_version(request)
        psp = str(request.path_params["psp"])
        key = self._header_key(request)
        data = json_object(await request.body())
        merchant = _text(data, "merchantAccount", 422, required=True)
        amount = data.get("amount")
        if not isinstance(amount, dict):
            raise ApiError(422, "validation", "Required field 'amount' is not provided.")
        value = _minor_units(amount.get("value"), "amount.value", 422)
        currency = _currency(amount.get("currency"), "amount.currency", 422)
        payment = await self._find(account, psp)
        if payment.status == "failed":
            raise ApiError(422, "validation", f"Original pspReference {psp} was refused")

        def record(claim: Claimed) -> StoredResponse:
            body = {
                "merchantAccount": merchant,
                "paymentPspReference": psp,
                "pspReference": new_payment_id(),
                "reference": data.get("reference"),
                "status": "received",
                "amount": {"value": value, "currency": currency},
            }
            response = StoredResponse(201, dumps(body))
            self.store.record_answer(claim.token, account, key or "", response)
            return response

        endpoint = f"POST /{version}/payments/{psp}/captures"
        return await self._run(request, account, key, _fingerprint(endpoint, data), record)

    # -- Mollie ----------------------------------------------------------------------------

    def _mollie_json(self, request: Request, payment: Payment) -> dict[str, Any]:
        value = f"{payment.amount // 100}.{payment.amount % 100:02d}"
        href = f"{request.base_url}v2/payments/{payment.id}"
        return {
            "resource": "payment",
            "id": payment.id,
            "mode": "test",
            "createdAt": int(payment.created_at),
            "amount": {"value": value, "currency": payment.currency},
            "description": payment.reference,
            "metadata": dict(payment.metadata) or None,
            "status": "paid" if payment.status == "succeeded" else payment.status,
            "_links": {"self": {"href": href, "type": "application/hal+json"}},
        }

    async def mollie_create(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        key = self._header_key(request)
        data = json_object(await request.body())
        amount = data.get("amount")
        if not isinstance(amount, dict) or not isinstance(amount.get("value"), str):
            raise ApiError(422, "invalid_request", "The amount is required: {currency, value}")
        if not _MOLLIE_VALUE.fullmatch(amount["value"]):
            raise ApiError(422, "invalid_request", "amount.value must be like '10.00'")
        value = _minor_units(int(amount["value"].replace(".", "")), "amount.value", 422)
        currency = _currency(amount.get("currency"), "amount.currency", 422)
        description = _text(data, "description", 422, required=True)
        metadata = _metadata(data, 422)

        def record(claim: Claimed) -> StoredResponse:
            payment = self._new_payment(
                account, key, value, currency, reference=description, metadata=metadata
            )
            response = StoredResponse(201, dumps(self._mollie_json(request, payment)))
            self.store.record_execution(claim.token, payment, response)
            return response

        fingerprint = _fingerprint("POST /v2/payments", data)
        return await self._run(request, account, key, fingerprint, record)

    async def mollie_get(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        payment = await self._find(account, str(request.path_params["payment_id"]))
        return JSONResponse(self._mollie_json(request, payment))

    # -- Square ----------------------------------------------------------------------------

    @staticmethod
    def _square_json(payment: Payment) -> dict[str, Any]:
        return {
            "id": payment.id,
            "created_at": int(payment.created_at),
            "amount_money": {"amount": payment.amount, "currency": payment.currency},
            "status": _SQUARE_STATUS.get(payment.status, payment.status.upper()),
            "source_type": "CARD",
            "reference_id": payment.reference,
            "note": payment.metadata.get("note"),
            "location_id": payment.metadata.get("location_id"),
        }

    def _square_answer(self, payment: Payment) -> StoredResponse:
        body: dict[str, Any] = {"payment": self._square_json(payment)}
        if payment.status == "failed":
            error = {
                "category": "PAYMENT_METHOD_ERROR",
                "code": "GENERIC_DECLINE",
                "detail": "Authorization error: 'GENERIC_DECLINE'",
            }
            return StoredResponse(400, dumps({"errors": [error], **body}))
        return StoredResponse(200, dumps(body))

    async def square_create(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        data = json_object(await request.body())
        key = _text(data, SQUARE_KEY_FIELD, 400, required=True)
        _text(data, "source_id", 400, required=True)
        money = data.get("amount_money")
        if not isinstance(money, dict):
            raise ApiError(400, "invalid_request", "amount_money is required")
        amount = _minor_units(money.get("amount"), "amount_money.amount", 400)
        currency = _currency(money.get("currency"), "amount_money.currency", 400)
        autocomplete = data.get("autocomplete", True)
        if not isinstance(autocomplete, bool):
            raise ApiError(400, "invalid_request", "autocomplete must be a boolean")
        reference = _text(data, "reference_id", 400, required=False)
        about = {
            name: data[name] for name in ("note", "location_id") if isinstance(data.get(name), str)
        }

        def record(claim: Claimed) -> StoredResponse:
            status = "succeeded" if autocomplete else "authorized"
            payment = self._new_payment(
                account, key, amount, currency, reference=reference, metadata=about, status=status
            )
            response = self._square_answer(payment)
            self.store.record_execution(claim.token, payment, response)
            return response

        # Square's key names the request; the rest of the body is what it must match.
        request_body = {name: value for name, value in data.items() if name != SQUARE_KEY_FIELD}
        fingerprint = _fingerprint("POST /v2/payments", request_body)
        return await self._run(request, account, key, fingerprint, record)

    async def square_get(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        payment = await self._find(account, str(request.path_params["payment_id"]))
        return JSONResponse({"payment": self._square_json(payment)})

    async def square_list(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        payments = await run_in_threadpool(lambda: self.store.find_payments(account))
        # Square lists the newest first unless told otherwise; it has no filter by reference.
        newest_first = payments[::-1]
        return JSONResponse({"payments": [self._square_json(p) for p in newest_first]})

    async def square_complete(self, request: Request) -> Response:
        account = authenticate(request, self.config)
        payment_id = str(request.path_params["payment_id"])
        body = await request.body()
        if body:
            json_object(body)
        await self._find(account, payment_id)

        def decide(payment: Payment | None) -> tuple[Payment, StoredResponse] | StoredResponse:
            if payment is None:
                raise ApiError(404, "not_found", f"no such payment: {payment_id}")
            if payment.status == "succeeded":
                # Completed already: answered as it is, nothing executes again.
                return StoredResponse(200, dumps({"payment": self._square_json(payment)}))
            if payment.status != "authorized":
                raise ApiError(400, "invalid_request", f"payment {payment_id} is {payment.status}")
            completed = attrs.evolve(payment, status="succeeded")
            return completed, self._square_answer(completed)

        def record(claim: Claimed) -> StoredResponse:
            outcome = self.store.change_payment(claim.token, account, "", payment_id, decide)
            return outcome[1] if isinstance(outcome, tuple) else outcome

        # CompletePayment takes no idempotency key: completing twice completes once.
        return await self._run(request, account, None, "", record)

    async def square_cancel_by_key(self, request: Request) -> Response:
        """CancelPaymentByIdempotencyKey: the body's ``idempotency_key`` names the payment
        (the key it was created under); an approved one is canceled, one already canceled
        stays so, and the answer is Square's empty object either way."""
        account = authenticate(request, self.config)
        data = json_object(await request.body())
        created_under = _text(data, SQUARE_KEY_FIELD, 400, required=True)
        found = await run_in_threadpool(
            lambda: self.store.find_payments(account, idempotency_key=created_under)
        )
        if not found:
            raise ApiError(404, "not_found", f"no payment created under {created_under!r}")
        payment_id = found[0].id

        def decide(payment: Payment | None) -> tuple[Payment, StoredResponse] | StoredResponse:
            if payment is None:
                raise ApiError(404, "not_found", f"no such payment: {payment_id}")
            if payment.status == "canceled":
                return StoredResponse(200, dumps({}))
            if payment.status != "authorized":
                raise ApiError(400, "invalid_request", f"payment {payment_id} is {payment.status}")
            return attrs.evolve(payment, status="canceled"), StoredResponse(200, dumps({}))

        def record(claim: Claimed) -> StoredResponse:
            outcome = self.store.change_payment(claim.token, account, "", payment_id, decide)
            return outcome[1] if isinstance(outcome, tuple) else outcome

        # It takes no key of its own: canceling twice cancels once.
        return await self._run(request, account, None, "", record)
