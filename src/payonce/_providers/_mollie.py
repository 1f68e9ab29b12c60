"""Mollie: ``Idempotency-Key`` kept for one hour, Bearer auth.

What Mollie documents and payonce relies on:

- An ``Idempotency-Key`` header on write requests: a second request with the same key is
  a duplicate and gets the first one's answer. Keys are kept for **one hour**: past it, a
  resend is a new request, so payonce stops resending an intent that may have reached
  Mollie after 54 minutes (90% of the hour) and reconciles it instead.
- ``Authorization: Bearer <live_… or test_… key>``.
- Validation errors are 422, so a 422 is a definitive refusal here, not a key mismatch.
- A key sent again to another endpoint or with other parameters is answered ``400 Bad
  Request`` (Mollie's "API idempotency" page, "Handling errors"); the profile reads a 400
  or 422 whose ``title`` or ``detail`` names the idempotency key as a key mismatch, never
  as a refusal of the request.
- Without a key, Mollie's advice is to inspect its list endpoints; they cannot filter by
  key or metadata, so the profile has no look-up: an ``unknown`` Mollie intent is resent
  under its key within the key's hour (``reconciled by resend``), and past it checked in
  the dashboard, then abandoned or paid again under a new reference.

payonce's own rules apply to the rest: timeouts and 5xx are retried under the same key, a
429 after its Retry-After, a 409 as "still in flight".
"""

from __future__ import annotations

import httpx

from .._lifecycle import Outcome, Verdict
from ._profile import Lookup, ProviderProfile, ReconcileSchedule, json_object, names_idempotency

__all__ = ["MOLLIE", "MOLLIE_KEY_LIFETIME", "mollie_profile", "mollie_refine"]

MOLLIE_KEY_LIFETIME = 3600.0
MOLLIE_RECONCILE_SCHEDULE = ReconcileSchedule(
    # Mollie forgets a key after an hour: within it, a "not found" lets payonce resend
    # under the same key, so the look-ups come early and often, and stop at the hour.
    first_after=30.0,
    interval=120.0,
    backoff=1.5,
    max_interval=900.0,
    max_tries=8,
    give_up_after=MOLLIE_KEY_LIFETIME,
)


def mollie_refine(response: httpx.Response) -> Verdict | None:
    """A key reused with other parameters (400, or a 422 naming the key): a mismatch."""
    if response.status_code not in (400, 422):
        return None
    body = json_object(response) or {}
    if not names_idempotency(body, "title", "detail"):
        return None
    return Verdict(
        Outcome.MISMATCH,
        ambiguous=False,
        reason=f"HTTP {response.status_code} key mismatch",
    )


def mollie_profile(*, lookup: Lookup | None = None, name: str = "mollie") -> ProviderProfile:
    """A Mollie profile; pass a ``lookup`` if you run a status endpoint of your own."""
    # What is not said here is ProviderProfile's default (the IETF draft's statuses, a
    # Bearer token in Authorization, keys in Idempotency-Key up to 255 characters).
    return ProviderProfile(
        name=name,
        key_lifetime=MOLLIE_KEY_LIFETIME,
        key_lifetime_documented=True,
        mismatch_statuses=frozenset(),
        refine=mollie_refine,
        lookup=lookup,
        reconcile_schedule=MOLLIE_RECONCILE_SCHEDULE,
    )


MOLLIE = mollie_profile()
"""Mollie: one-hour keys, no automatic reconciliation."""
