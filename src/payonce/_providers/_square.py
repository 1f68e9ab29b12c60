"""Square: the key in the JSON body (``idempotency_key``), Bearer auth, errors in a list.

What Square documents (and its Python SDK, ``squareup``, shows) and payonce relies on:

- Create calls (``CreatePayment``, ``RefundPayment``…) take a required ``idempotency_key``
  field in the JSON body, at most 45 characters; the same key with the same body returns
  the first result, the same key with another body is refused with 400 and error code
  ``IDEMPOTENCY_KEY_REUSED``. ``CompletePayment`` and ``CancelPayment`` take no key: the
  payment's state makes them safe to repeat.
- ``Authorization: Bearer <access token>``.
- Errors are ``{"errors": [{"category", "code", "detail"}]}``; a declined card is 400
  (``GENERIC_DECLINE``…), definitive.
- How long Square keeps a key is not documented: payonce assumes 24 hours (raise or lower
  it with ``square_profile(key_lifetime=...)``).
- ``ListPayments`` cannot filter by key or ``reference_id``, so the profile has no look-up
  (an ``unknown`` Square intent is resent under the same key while the key is surely
  remembered, which Square answers with the first result: ``reconciled by resend``); give
  it one with ``square_profile(lookup=...)`` if you run a status
  endpoint of your own.
"""

from __future__ import annotations

import re

import httpx

from .._lifecycle import Outcome, Verdict
from ._profile import BodyKeyField, Lookup, ProviderProfile, json_object

__all__ = ["SQUARE", "SQUARE_KEY_FIELD", "square_profile"]

SQUARE_KEY_FIELD = "idempotency_key"
SQUARE_KEY_MAX_LENGTH = 45
_REUSED = "IDEMPOTENCY_KEY_REUSED"


def square_refine(response: httpx.Response) -> Verdict | None:
    """A key reused with another body is Square's 400 ``IDEMPOTENCY_KEY_REUSED``."""
    if response.status_code != 400:
        return None
    errors = (json_object(response) or {}).get("errors")
    if not isinstance(errors, list):
        return None
    codes = {error.get("code") for error in errors if isinstance(error, dict)}
    if _REUSED not in codes:
        return None
    return Verdict(Outcome.MISMATCH, ambiguous=False, reason=f"HTTP 400 {_REUSED}")


_KEYED_CALLS = re.compile(r"(?:^|/)v2/(?:payments|refunds|orders|orders/[^/]+/pay|cards)$")
"""The create calls whose body takes a required ``idempotency_key`` (CreatePayment,
RefundPayment, CreateOrder, PayOrder, CreateCard): payonce puts the field in when the
caller left it out. Not ``/v2/payments/cancel``, whose ``idempotency_key`` names the
payment to cancel, nor the calls that take no key (CompletePayment, CancelPayment)."""


def square_takes_key(method: str, path: str) -> bool:
    """Whether a request is one of Square's create calls that take the key in the body."""
    return method.upper() == "POST" and _KEYED_CALLS.search(path) is not None


_CANCEL_BY_KEY = re.compile(r"(?:^|/)v2/payments/cancel$")


def square_keys_itself(method: str, path: str) -> bool:
    """Whether a request's ``idempotency_key`` field is its own key: every one but
    CancelPaymentByIdempotencyKey's, which names the payment to cancel (it takes no key of
    its own; cancelling twice is harmless, so payonce sends it as it is, under a step key
    of its own journal)."""
    return not (method.upper() == "POST" and _CANCEL_BY_KEY.search(path) is not None)


def square_profile(
    *,
    lookup: Lookup | None = None,
    key_lifetime: float = 24 * 3600.0,
    key_lifetime_documented: bool = False,
    name: str = "square",
) -> ProviderProfile:
    """A Square profile; pass a ``lookup`` if you run a status endpoint of your own, and
    ``key_lifetime_documented=True`` with the ``key_lifetime`` Square has promised you
    (its docs publish none)."""
    # What is not said here is ProviderProfile's default (a Bearer token in Authorization,
    # 409 in flight, 429 not executed, 5xx retried under the same key).
    return ProviderProfile(
        name=name,
        key_field=SQUARE_KEY_FIELD,
        key_max_length=SQUARE_KEY_MAX_LENGTH,
        key_lifetime=key_lifetime,
        key_lifetime_documented=key_lifetime_documented,
        # A 422 is no key mismatch at Square: square_refine finds the reused key in a 400.
        mismatch_statuses=frozenset(),
        lookup=lookup,
        refine=square_refine,
        prepare_body=BodyKeyField(SQUARE_KEY_FIELD),
        body_key_required=square_takes_key,
        prepares=square_keys_itself,
    )


SQUARE = square_profile()
"""Square: the key in the body's ``idempotency_key``, no automatic reconciliation."""
