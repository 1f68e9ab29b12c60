"""Adyen: ``X-API-Key`` auth, 64-character keys kept for days, error 704 while in progress.

What Adyen documents and payonce relies on:

- ``Idempotency-Key`` on POST, at most 64 characters (a UUID is recommended), scoped to
  the company account and kept for a *minimum* period after first submission. Adyen's
  page has said 7 days and now says 31; payonce takes the shorter one, since resending
  too early is harmless and resending too late is not.
- The API key goes in ``X-API-Key``.
- A request whose key is already being processed is refused with ``errorCode`` 704
  ("request already processed or in progress"); retrying under the key gets the stored
  answer once the first request ends.
- Adyen documents no error for a key reused with another request: its page says the
  first request's answer is returned. A 4xx whose ``errorCode`` or ``message`` names the
  idempotency key (other than 704) is read as a key mismatch, never as a refusal of the
  request (the sandbox's Adyen dialect answers a reused key ``422`` that way).
- Timeouts and 5xx are retried under the same key. A ``Transient-Error: true`` response
  header marks an answer worth retrying. Validation errors (422) are definitive.
- A refused payment is not an HTTP error: ``/payments`` answers 200 with
  ``resultCode: Refused``. payonce stores and replays it like any 2xx; read ``resultCode``.
- Adyen has no API to look a payment up by merchant reference (it reports outcomes by
  webhook), so the ``adyen`` profile has no look-up; give it one with
  ``adyen_profile(lookup=adyen_reference_lookup(...))`` when you run a status endpoint.
"""

from __future__ import annotations

import json

import httpx

from .._lifecycle import Outcome, Verdict, retry_after
from ._profile import (
    Lookup,
    ProviderProfile,
    ReconcileSchedule,
    json_object,
    names_idempotency,
)

__all__ = ["ADYEN", "adyen_profile", "adyen_reference_lookup"]

ADYEN_KEY_LIFETIME = 7 * 24 * 3600.0
ADYEN_KEY_MAX_LENGTH = 64
ADYEN_RECONCILE_SCHEDULE = ReconcileSchedule(
    # Adyen keeps keys a week; with a reference look-up of your own (its reports lag),
    # ask after a minute, then ever more rarely, for three days.
    first_after=60.0,
    interval=600.0,
    backoff=2.0,
    max_interval=6 * 3600.0,
    max_tries=12,
    give_up_after=3 * 24 * 3600.0,
)
_IN_PROGRESS = "704"


def adyen_transient(response: httpx.Response) -> bool | None:
    # Only a positive hint: the absence of the header says nothing about a 5xx.
    value = response.headers.get("transient-error", "").strip().lower()
    return True if value == "true" else None


def adyen_refine(response: httpx.Response) -> Verdict | None:
    if not 400 <= response.status_code < 500:
        return None
    body = json_object(response) or {}
    if str(body.get("errorCode")) != _IN_PROGRESS:
        if names_idempotency(body, "errorCode", "message"):
            # Adyen documents no answer for a key reused with another request (its page
            # says a key's first answer is replayed); a refusal that names the key is
            # about the key, not the request: read as "this key holds another request",
            # never as a decline a later run could pass over.
            return Verdict(
                Outcome.MISMATCH,
                ambiguous=False,
                reason=f"HTTP {response.status_code} key mismatch ({body.get('errorCode')})",
            )
        return None
    # The first request with this key is still running and may well succeed: ambiguous.
    return Verdict(
        Outcome.RETRY,
        ambiguous=True,
        retry_after=retry_after(response),
        reason=f"HTTP {response.status_code} errorCode 704 (in progress)",
    )


_DECLINED_RESULTS = frozenset({"Refused", "Cancelled", "Error"})
"""Adyen's ``resultCode`` values of a payment that did not go through."""


def adyen_declined(body: bytes) -> bool:
    """Whether a ``/payments`` answer (HTTP 200) declines the payment in its ``resultCode``."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("resultCode") in _DECLINED_RESULTS


def adyen_reference_lookup(
    path: str, *, param: str = "reference", status_field: str = "status"
) -> Lookup:
    """A look-up by merchant reference at a status endpoint you provide.

    ``GET {path}?{param}=<reference>`` must answer ``{"data": [...]}``; each item's
    ``status_field`` holds an Adyen ``resultCode`` (or the sandbox's status).
    """
    return Lookup(
        path=path,
        by="reference",
        param=param,
        status_field=status_field,
        succeeded=frozenset({"Authorised", "authorised", "succeeded"}),
        failed=frozenset({"Refused", "refused", "Cancelled", "cancelled", "Error", "failed"}),
    )


def adyen_profile(
    *,
    lookup: Lookup | None = None,
    key_lifetime: float = ADYEN_KEY_LIFETIME,
    name: str = "adyen",
) -> ProviderProfile:
    """An Adyen profile; ``key_lifetime`` may be raised to the 31 days Adyen now promises."""
    # What is not said here is ProviderProfile's default (the IETF draft's statuses, a
    # Bearer token in Authorization, keys in Idempotency-Key up to 255 characters).
    return ProviderProfile(
        name=name,
        key_max_length=ADYEN_KEY_MAX_LENGTH,
        key_lifetime=key_lifetime,
        key_lifetime_documented=True,
        # 422 is Adyen's validation error: definitive, but not a key mismatch.
        mismatch_statuses=frozenset(),
        auth_header="X-API-Key",
        auth_scheme=None,
        lookup=lookup,
        should_retry_hint=adyen_transient,
        refine=adyen_refine,
        declined_in_body=adyen_declined,
        reconcile_schedule=ADYEN_RECONCILE_SCHEDULE,
    )


ADYEN = adyen_profile()
"""Adyen without automatic reconciliation (Adyen has no look-up by reference)."""
