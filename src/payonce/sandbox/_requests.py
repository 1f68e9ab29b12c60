"""What a request to the sandbox says: its account, its idempotency key, a fault it forces,
and its parameters, read from JSON or Stripe-style form bodies; anything malformed is a 4xx."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final, TypeGuard
from urllib.parse import parse_qsl

import attrs
from starlette.requests import Request

from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._errors import ApiError
from payonce.sandbox._faults import FaultName, is_fault_name

MAX_KEY_LENGTH: Final = 255
_MAX_AMOUNT: Final = 10**12  # keeps amounts inside SQLite's 64-bit integers
_PAYMENT_FIELDS: Final = frozenset({"amount", "currency", "reference", "metadata"})
_METADATA_PAIR: Final = re.compile(r"metadata\[([^\[\]]+)\]")
# One clause of Stripe's search language: metadata['name']:'value', quotes escaped by "\".
_METADATA_QUERY: Final = re.compile(r"metadata\['((?:[^'\\]|\\.)+)'\]:'((?:[^'\\]|\\.)*)'")


def authenticate(request: Request, config: SandboxConfig) -> str:
    """The account whose API key the request carries, the way ``config.auth`` expects it."""
    if config.auth == "x-api-key":
        account = config.api_keys.get(request.headers.get("x-api-key", "").strip())
        if account is None:
            raise ApiError(401, "authentication_error", "invalid API key")
        return account
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "basic" and config.dialect == "stripe":
        # Stripe also takes the key as a Basic user name (curl -u sk_test_...:).
        token = _basic_user(token)
        scheme = "bearer"
    account = config.api_keys.get(token.strip()) if scheme.lower() == "bearer" else None
    if account is None:
        raise ApiError(
            401, "authentication_error", "invalid API key", {"WWW-Authenticate": "Bearer"}
        )
    return account


def _basic_user(credentials: str) -> str:
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return ""
    return decoded.partition(":")[0]


def idempotency_key(request: Request, header: str = "Idempotency-Key") -> str:
    key = request.headers.get(header, "")
    # Accept the RFC 8941 sf-string form ("abc") as well as the bare value.
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key:
        raise ApiError(400, "idempotency_key_missing", f"an {header} header is required")
    if len(key) > MAX_KEY_LENGTH:
        raise ApiError(400, "invalid_request", f"{header} exceeds {MAX_KEY_LENGTH} chars")
    return key


def forced_fault(request: Request) -> FaultName | None:
    name = request.headers.get("sandbox-fault")
    if name is None:
        return None
    if not is_fault_name(name):
        raise ApiError(400, "invalid_request", f"unknown Sandbox-Fault {name!r}")
    return name


def is_form(request: Request) -> bool:
    content_type = request.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded"


def json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        raise ApiError(400, "invalid_request", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "request body must be a JSON object")
    return data


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


def metadata_query(query: str) -> tuple[str, str]:
    """The name and value a search for ``metadata['name']:'value'`` looks for."""
    match = _METADATA_QUERY.fullmatch(query.strip())
    if match is None:
        raise ApiError(400, "invalid_request", "query must be metadata['name']:'value'")
    return _unescape(match.group(1)), _unescape(match.group(2))


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
        data = _form_object(body) if form else json_object(body)
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
