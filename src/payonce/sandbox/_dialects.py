"""How each provider words its answers: error bodies, idempotency messages, payment results.

The sandbox decides what happens the same way whatever its dialect; only the shape of the
answer differs, so that payonce's provider profiles meet the bodies they are written for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal

from payonce.sandbox._store import Payment, StoredResponse

Dialect = Literal["sandbox", "stripe", "adyen", "mollie", "square"]
DIALECTS: Final[tuple[Dialect, ...]] = ("sandbox", "stripe", "adyen", "mollie", "square")

# The sandbox's error types under Stripe's names: (type, code).
_STRIPE_ERRORS: Final[Mapping[str, tuple[str, str | None]]] = {
    "idempotency_key_mismatch": ("idempotency_error", None),
    "idempotency_key_in_use": ("invalid_request_error", "idempotency_key_in_use"),
    "lock_timeout": ("invalid_request_error", "lock_timeout"),
    "rate_limit": ("invalid_request_error", "rate_limit"),
    "service_unavailable": ("api_error", None),
    "not_found": ("invalid_request_error", "resource_missing"),
    # The Stripe resources' own refusals, under the codes Stripe documents for them.
    "parameter_missing": ("invalid_request_error", "parameter_missing"),
    "parameter_unknown": ("invalid_request_error", "parameter_unknown"),
    "parameter_invalid_integer": ("invalid_request_error", "parameter_invalid_integer"),
    "payment_intent_unexpected_state": (
        "invalid_request_error",
        "payment_intent_unexpected_state",
    ),
    "card_declined": ("card_error", "card_declined"),
}
# Adyen numbers its errors; 704 is "request already processed or in progress". Other
# errors keep the sandbox's type as their code.
_ADYEN_CODES: Final[Mapping[str, str]] = {"idempotency_key_in_use": "704"}
# Square's error codes and categories for the sandbox's error types (Square answers every
# error as {"errors": [{"category", "code", "detail"}]}).
_SQUARE_ERRORS: Final[Mapping[str, tuple[str, str]]] = {
    "idempotency_key_mismatch": ("INVALID_REQUEST_ERROR", "IDEMPOTENCY_KEY_REUSED"),
    "idempotency_key_in_use": ("API_ERROR", "CONFLICT"),
    "lock_timeout": ("API_ERROR", "CONFLICT"),
    "rate_limit": ("RATE_LIMIT_ERROR", "RATE_LIMITED"),
    "service_unavailable": ("API_ERROR", "SERVICE_UNAVAILABLE"),
    "not_found": ("INVALID_REQUEST_ERROR", "NOT_FOUND"),
    "authentication_error": ("AUTHENTICATION_ERROR", "UNAUTHORIZED"),
    "card_declined": ("PAYMENT_METHOD_ERROR", "GENERIC_DECLINE"),
}
_MOLLIE_TITLES: Final[Mapping[int, str]] = {
    400: "Bad Request",
    401: "Unauthorized Request",
    404: "Not Found",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    503: "Service Unavailable",
}
_KEY_MESSAGES: Final[Mapping[tuple[str, str], str]] = {
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
    # Adyen documents no answer for a reused key; the sandbox's names the key.
    ("adyen", "idempotency_key_mismatch"): (
        "Idempotency-Key '{key}' was already used with a different request"
    ),
    ("mollie", "idempotency_key_mismatch"): (
        "The Idempotency-Key '{key}' was already used for a request to another endpoint or "
        "with different parameters."
    ),
    ("square", "idempotency_key_mismatch"): (
        "The idempotency key '{key}' can only be used with the same request it was first used with."
    ),
}


def dumps(content: Any) -> bytes:
    # The same encoding as JSONResponse, so a replay is byte-identical to the original.
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def error_body(
    dialect: Dialect,
    status: int,
    type_: str,
    message: str,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The error's body in ``dialect``; ``fields`` add to Stripe's error object only."""
    if dialect == "stripe":
        kind, code = _STRIPE_ERRORS.get(type_, ("invalid_request_error", None))
        error: dict[str, Any] = {"type": kind, "message": message}
        if code is not None:
            error["code"] = code
        error.update(fields or {})
        return {"error": error}
    if dialect == "adyen":
        kind = "security" if status in (401, 403) else "internal" if status >= 500 else "validation"
        code = _ADYEN_CODES.get(type_, type_)
        return {"status": status, "errorCode": code, "message": message, "errorType": kind}
    if dialect == "square":
        category, code = _SQUARE_ERRORS.get(type_, ("INVALID_REQUEST_ERROR", "BAD_REQUEST"))
        return {"errors": [{"category": category, "code": code, "detail": message}]}
    if dialect == "mollie":
        title = _MOLLIE_TITLES.get(status, "Error")
        return {"status": status, "title": title, "detail": message}
    return {"error": {"type": type_, "message": message}}


def key_message(dialect: Dialect, type_: str, key: str, default: str) -> str:
    """The provider's own words for an idempotency error about ``key``."""
    template = _KEY_MESSAGES.get((dialect, type_))
    return template.format(key=key) if template else default


def mismatch_status(dialect: Dialect) -> int:
    """Stripe, Square and Mollie (its "API idempotency" page) refuse a key reused with other
    parameters as a bad request; the draft says 422 (and the sandbox's Adyen, which
    documents no such answer)."""
    return 400 if dialect in ("stripe", "square", "mollie") else 422


def payment_answer(dialect: Dialect, payment: Payment) -> StoredResponse:
    """What the provider answers once ``payment`` has executed, succeeded or declined."""
    declined = payment.status == "failed"
    if dialect == "adyen":
        # Adyen answers a refusal with 200 too: the outcome is in resultCode.
        body = {
            **payment.to_json(),
            "pspReference": payment.id,
            "merchantReference": payment.reference,
            "resultCode": "Refused" if declined else "Authorised",
        }
        return StoredResponse(200, dumps(body))
    if declined:
        error = {
            "type": "card_error",
            "code": "card_declined",
            "message": "Your card was declined.",
            "payment": payment.to_json(),
        }
        return StoredResponse(402, dumps({"error": error}))
    return StoredResponse(201, dumps(payment.to_json()))
