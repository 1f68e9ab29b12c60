"""Responses payonce hands back: answers as they arrive, stored, and replayed from the
journal, each tagged with what payonce knows about it (``payonce.response_info``)."""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import httpx

from .._lifecycle import IntentRecord, IntentState, StoredResponse
from .._providers._profile import ProviderProfile
from ._events import log_extra

__all__ = [
    "DEFAULT_MAX_STORED_BYTES",
    "elapsed",
    "from_lookup",
    "ResponseInfo",
    "replayed",
    "response_info",
    "stored",
    "tagged",
]

logger = logging.getLogger("payonce")

DEFAULT_MAX_STORED_BYTES = 1024 * 1024
"""Answers larger than this are journaled with their status and headers only."""

# Response headers never worth replaying: hop-by-hop, cookies, and encodings that described
# the bytes on the wire rather than the decoded body payonce stores.
_DROPPED_RESPONSE_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-encoding",
        "content-length",
        "set-cookie",
        "date",
        "server",
    }
)


@attrs.frozen
class ResponseInfo:
    """What payonce knows about a response it returned (``payonce.response_info(r)``)."""

    key: str
    reference: str | None
    state: IntentState
    replayed: bool
    """True when the intent was settled before this call, which executed nothing: its
    answer is the journal's (or, when its body was too large to journal, the provider's
    replay under the same key, or the provider's record found by the status look-up)."""
    provider_replayed: bool
    """True when the provider said it replayed a stored answer for this key."""
    attempts: int
    body_stored: bool
    """False when the body exceeded the size cap and only status and headers were kept."""


def response_info(response: httpx.Response) -> ResponseInfo | None:
    """payonce's record of a response, or None for a response payonce did not produce."""
    info = response.extensions.get("payonce")
    if isinstance(info, _Tag):
        info = response.extensions["payonce"] = info.info(response)
    return info if isinstance(info, ResponseInfo) else None


class _Tag:
    """What a response's ``ResponseInfo`` is made of, made into one only when asked: most
    callers never ask, and each intent would pay for it."""

    __slots__ = ("_profile", "_provider_replayed", "_record", "_replayed")

    def __init__(
        self,
        record: IntentRecord,
        replayed: bool,
        provider_replayed: bool | None,
        profile: ProviderProfile | None,
    ) -> None:
        self._record = record
        self._replayed = replayed
        self._provider_replayed = provider_replayed
        self._profile = profile

    def info(self, response: httpx.Response) -> ResponseInfo:
        record = self._record
        provider_replayed = self._provider_replayed
        if provider_replayed is None:
            assert self._profile is not None
            provider_replayed = self._profile.was_replayed(response)
        return ResponseInfo(
            key=record.key,
            reference=record.reference,
            state=record.state,
            replayed=self._replayed,
            provider_replayed=provider_replayed,
            attempts=record.attempt_count,
            body_stored=record.response.body_stored if record.response is not None else True,
        )


def stored(response: httpx.Response, *, record: IntentRecord, max_bytes: int) -> StoredResponse:
    """A definitive answer as the journal keeps it: status, kept headers, capped body."""
    body = response.content
    body_stored = len(body) <= max_bytes
    if not body_stored:
        logger.warning(
            "intent %s: response body of %d bytes exceeds the %d-byte cap; journaled "
            "status and headers only: a replay will ask the provider for it again",
            record.key,
            len(body),
            max_bytes,
            extra=log_extra(record),
        )
    return StoredResponse(
        status=response.status_code,
        headers=tuple(
            (name, value)
            for name, value in response.headers.multi_items()
            if name.lower() not in _DROPPED_RESPONSE_HEADERS
        ),
        body=body if body_stored else b"",
        body_stored=body_stored,
    )


def from_lookup(record: dict[str, Any], status: int) -> StoredResponse:
    """The provider's record, found by a status look-up, as the intent's stored answer."""
    return StoredResponse(
        status=status,
        headers=(("content-type", "application/json"),),
        body=json.dumps(record, separators=(",", ":")).encode(),
    )


def tagged(
    response: httpx.Response,
    record: IntentRecord,
    *,
    replayed: bool,
    provider_replayed: bool | None,
    profile: ProviderProfile | None = None,
) -> httpx.Response:
    """The response, carrying its ``ResponseInfo``. ``provider_replayed`` None: ``profile``
    tells from the response's headers, if anyone asks."""
    tag = _Tag(record, replayed, provider_replayed, profile)
    response.extensions = {**response.extensions, "payonce": tag}
    return response


def replayed(record: IntentRecord, *, found: dict[str, Any] | None = None) -> httpx.Response | None:
    """The journaled answer of a settled intent, as an ``httpx.Response``; None when it has
    none stored. ``found``: the provider's record a status look-up found, as its body (the
    journaled answer's was too large to keep)."""
    answer = record.response
    if answer is None:
        return None
    if found is not None:
        answer = from_lookup(found, answer.status)
    response = httpx.Response(
        answer.status,
        headers=list(answer.headers),
        content=answer.body,
        request=httpx.Request(record.method, record.url),
    )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "intent %s replayed from the journal: HTTP %d",
            record.key,
            answer.status,
            extra=log_extra(record),
        )
    return tagged(response, record, replayed=True, provider_replayed=False)


def elapsed(response: httpx.Response) -> float | None:
    """Seconds from sending the request to the end of its answer, once it is read."""
    try:
        return response.elapsed.total_seconds()
    except RuntimeError:  # not read to its end (a stream cut short)
        return None
