"""Stripe: form-encoded bodies, ``Stripe-Should-Retry``, and reconciliation by metadata search.

What Stripe documents and payonce relies on:

- ``Idempotency-Key``, raw, up to 255 characters; keys are kept at least 24 hours.
- Stripe stores the status and body of the first request that *began executing* and replays
  it for the same key, 500s included; a replay carries ``Idempotent-Replayed: true``.
- ``Stripe-Should-Retry: true|false`` tells a client whether a retry can help; it wins over
  the status, as in stripe-python.
- Reusing a key with other parameters is an error of type ``idempotency_error`` (HTTP 400
  in practice); a request that runs into another one holding the same key or object gets a
  409 (``idempotency_key_in_use``, ``lock_timeout``) and may be retried.
- There is no look-up by idempotency key; the Search API finds objects by metadata
  (``metadata['k']:'v'``), so payonce tags the key into the object's metadata.
"""

from __future__ import annotations

import calendar
import datetime
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

import attrs
import httpx

from .._lifecycle import FormData, Outcome, Verdict, retry_after
from ._profile import Lookup, ProviderProfile, ReconcileSchedule, json_object

__all__ = ["STRIPE", "STRIPE_METADATA_KEY", "stripe_form_pairs", "stripe_profile"]

STRIPE_METADATA_KEY = "payonce_idempotency_key"
STRIPE_SEARCH_PATH = "/v1/payment_intents/search"
_FORM = "application/x-www-form-urlencoded"
STRIPE_RECONCILE_SCHEDULE = ReconcileSchedule(
    # Stripe's Search API is not read-after-write: a payment may take a minute or more to
    # become searchable, so the first look-up waits for it.
    first_after=120.0,
    interval=300.0,
    backoff=2.0,
    max_interval=4 * 3600.0,
    max_tries=8,
    # Past the key's 24 hours no answer could let payonce resend: a person decides.
    give_up_after=24 * 3600.0,
)
_CONCURRENT_CODES = frozenset({"idempotency_key_in_use", "lock_timeout"})
# Stripe's wording for a key reused with other parameters, or on another endpoint; older
# API versions sent it as an invalid_request_error, before the idempotency_error type.
_MISMATCH_WORDING = "keys for idempotent requests can only be used"


def stripe_refuse_request(method: str, path: str, content_type: str | None) -> str | None:
    """Stripe's v1 API takes form-encoded bodies only (its v2 API takes JSON)."""
    media_type = (content_type or "").split(";")[0].strip().lower()
    if path.startswith("/v1/") and (
        media_type == "application/json" or media_type.endswith("+json")
    ):
        return (
            f"Stripe's v1 API takes form-encoded bodies, not JSON: pass data={{...}} (nested "
            f"fields in brackets, e.g. 'metadata[order]') for {method} {path}. A JSON body "
            "would be refused, and could not carry the metadata tag reconciliation looks for"
        )
    return None


def stripe_should_retry(response: httpx.Response) -> bool | None:
    value = response.headers.get("stripe-should-retry", "").strip().lower()
    return {"true": True, "false": False}.get(value)


def stripe_refine(response: httpx.Response) -> Verdict | None:
    """Tell a key reused for other parameters (definitive) from a key or object busy (retry)."""
    status = response.status_code
    if status not in (400, 404, 409):
        return None
    body = json_object(response) or {}
    error = body.get("error")
    if not isinstance(error, dict):
        error = {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    kind = error.get("type")
    message = str(error.get("message") or "").lower()
    concurrent = code in _CONCURRENT_CODES or "in-progress" in message or "in progress" in message
    worded = _MISMATCH_WORDING in message
    # A 409 idempotency_error without the mismatch wording could be the "key in use" conflict
    # under another name: calling that a mismatch would report a payment that may still go
    # through as refused, so on a 409 only the explicit wording counts.
    mismatch = worded or (kind == "idempotency_error" and status != 409)
    if mismatch and not concurrent:
        return Verdict(Outcome.MISMATCH, ambiguous=False, reason=f"HTTP {status} idempotency_error")
    if status != 409:
        return None
    if stripe_should_retry(response) is False:
        return None  # the generic rules turn an explicit "do not retry" into a failure
    # Another request holds our key (it may well execute) or the object we touch: stripe-python
    # retries every 409, and so does payonce, under the same key.
    return Verdict(
        Outcome.RETRY,
        ambiguous=True,
        retry_after=retry_after(response),
        reason=f"HTTP 409 {code or 'conflict'}",
    )


def stripe_form_pairs(data: FormData) -> list[tuple[str, str]]:
    """A form's pairs as Stripe's API and its Python SDK encode them.

    A nested mapping becomes ``name[key]``, a list ``name[0]``, ``name[1]``… (a mapping in
    a list ``name[0][key]``), ``True``/``False`` become ``true``/``false`` and a ``None``
    value is left out; a ``datetime`` becomes its Unix timestamp, and an object with an
    ``id`` (a Stripe object) its id. A list in a list is encoded as a mapping of its indexes;
    other items of a list are written as they are (``str()``), as the SDK does.
    """
    items = data.items() if isinstance(data, Mapping) else data
    return [pair for key, value in items for pair in _stripe_pairs(str(key), value)]


def _stripe_pairs(key: str, value: Any) -> Iterator[tuple[str, str]]:
    if value is None:
        return
    if hasattr(value, "id") and not isinstance(value, Mapping):
        yield key, str(value.id)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if isinstance(item, Mapping):
                yield from _stripe_pairs(f"{key}[{index}]", item)
            elif isinstance(item, list | tuple):
                # A list in a list is encoded as a mapping of its indexes.
                yield from _stripe_pairs(f"{key}[{index}]", dict(enumerate(item)))
            else:
                yield f"{key}[{index}]", str(item)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield from _stripe_pairs(f"{key}[{name}]", item)
    elif isinstance(value, datetime.datetime):
        yield key, str(_timestamp(value))
    elif isinstance(value, bool):
        yield key, "true" if value else "false"
    else:
        yield key, str(value)


def _timestamp(moment: datetime.datetime) -> int:
    if moment.tzinfo is not None and moment.utcoffset() is not None:
        return calendar.timegm(moment.utctimetuple())
    return int(time.mktime(moment.timetuple()))  # a naive time is local, as the SDK reads it


def stripe_creation_only(method: str, path: str, body: bytes) -> bool:
    """A creation that asks for nothing more than the object (no ``confirm=true``): the
    object found at all is its whole effect, whatever its status."""
    if not stripe_creates(method, path):
        return False
    pairs = parse_qsl(body.decode("latin-1"), keep_blank_values=True)
    return not any(name == "confirm" and value.lower() == "true" for name, value in pairs)


def _search_expression(field: str) -> Callable[[str], str]:
    def expression(key: str) -> str:
        # The Search query language quotes values in single quotes, escaped by a backslash.
        quoted = key.replace("\\", "\\\\").replace("'", "\\'")
        return f"metadata['{field}']:'{quoted}'"

    return expression


@attrs.frozen
class _TagMetadata:
    """Adds ``metadata[<field>]=<key>`` to a form body, the same way on every attempt."""

    field: str

    def __call__(self, body: bytes, content_type: str | None, key: str) -> bytes:
        if (content_type or "").split(";")[0].strip().lower() != _FORM:
            return body
        name = f"metadata[{self.field}]"
        # latin-1 maps every byte to one character, so foreign bytes survive the round trip.
        if any(
            pair[0] == name for pair in parse_qsl(body.decode("latin-1"), keep_blank_values=True)
        ):
            return body  # the caller tagged it already; their value is what Stripe sees
        tag = urlencode([(name, key)], safe="[]").encode()
        return body + b"&" + tag if body else tag


def _body_as_is(body: bytes, content_type: str | None, key: str) -> bytes:
    return body


def stripe_creates(method: str, path: str) -> bool:
    """A request that creates an object: a POST to a collection (``/v1/payment_intents``,
    ``/v1/refunds``), the only kind the metadata tag goes into. A confirm or a capture
    takes no metadata (Stripe refuses the parameter), and an update's tag would replace the
    key the object was created under, which its look-up searches by."""
    segments = [part for part in path.split("/") if part]
    # After the API version: a base URL with a path of its own (a proxy's) may come first.
    after_version = segments[segments.index("v1") + 1 :] if "v1" in segments else segments[1:]
    return method.upper() == "POST" and len(after_version) == 1


def stripe_profile(
    *,
    tag_metadata: bool = True,
    metadata_key: str = STRIPE_METADATA_KEY,
    search_path: str = STRIPE_SEARCH_PATH,
    name: str = "stripe",
) -> ProviderProfile:
    """A Stripe profile.

    With ``tag_metadata`` (the default), every form-encoded creation (a POST to a
    collection such as ``/v1/payment_intents``) carries
    ``metadata[<metadata_key>]=<idempotency key>``, and an ``unknown`` intent is looked up
    with the Search API at ``search_path`` (``/v1/payment_intents/search``; use
    ``/v1/charges/search``, ``/v1/customers/search``… for other objects). Without it, the
    body is sent untouched and intents cannot be reconciled automatically.
    """
    lookup = None
    if tag_metadata:
        lookup = Lookup(
            path=search_path,
            by="key",
            param="query",
            format_value=_search_expression(metadata_key),
            list_field="data",
            status_field="status",
            # requires_capture: authorised and held, i.e. the request did what it asked.
            # requires_payment_method is also a fresh, unconfirmed intent's status, so for
            # a creation that confirms (confirm=true) it settles nothing: such an intent
            # stays unknown for an operator to judge. One that only creates is settled by
            # the object's existence (creation_only).
            succeeded=frozenset({"succeeded", "requires_capture"}),
            failed=frozenset({"canceled", "failed"}),
            # A PaymentIntent created to be confirmed by a later step: found, it was created.
            creation_only=stripe_creation_only,
            # Only a creation carries the tag the search finds: a confirm or a capture of
            # the object cannot be seen, and "no result" says nothing about it.
            finds=stripe_creates,
            # Stripe documents that search results may lag writes by up to a minute.
            consistent=False,
        )
    # What is not said here is ProviderProfile's default (the IETF draft's statuses, a
    # Bearer token in Authorization, keys in Idempotency-Key up to 255 characters).
    return ProviderProfile(
        name=name,
        key_lifetime=24 * 3600.0,
        key_lifetime_documented=True,
        # Only consulted for a settled answer, to raise IntentMismatch: stripe_refine classifies
        # every 409 first, so the 409s that settle are idempotency_errors (and the rare 409
        # with Stripe-Should-Retry: false).
        mismatch_statuses=frozenset({409}),
        replay_headers=("Idempotent-Replayed",),
        # A connected account's requests (Stripe Connect): Stripe keeps their idempotency
        # keys, and their objects, in that account.
        account_scope_headers=frozenset({"Stripe-Account", "Stripe-Context"}),
        # Stripe documents the header on every replay.
        marks_replays=True,
        lookup=lookup,
        should_retry_hint=stripe_should_retry,
        refine=stripe_refine,
        refuse_request=stripe_refuse_request,
        prepare_body=_TagMetadata(metadata_key) if tag_metadata else _body_as_is,
        prepares=stripe_creates,
        encode_form=stripe_form_pairs,
        reconcile_schedule=STRIPE_RECONCILE_SCHEDULE,
    )


STRIPE = stripe_profile()
"""Stripe with metadata tagging and reconciliation through ``/v1/payment_intents/search``."""
