"""What an answer means: every classification of a response, a transport error or a
status look-up's answer, in one place.

A provider profile plugs into it (``refine``, ``should_retry_hint``, its status sets, its
``Lookup``) through the protocols ``AnswerRules`` and ``LookupRules``, which the profiles
satisfy: the lifecycle does not import the providers. Nothing else in payonce classifies.
"""

from __future__ import annotations

import email.utils
import enum
import json
import ssl
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import attrs
import httpx

from ._states import IntentState

__all__ = [
    "LOOKUP_FAILURES",
    "AnswerRules",
    "LookupKind",
    "LookupRules",
    "LookupVerdict",
    "Outcome",
    "ReconcileOutcome",
    "Verdict",
    "classify_error",
    "classify_lookup",
    "classify_lookup_error",
    "classify_response",
    "parse_retry_after",
    "retry_after",
]


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    """2xx: definitive; stored and replayed."""
    FAILED = "failed"
    """Non-retryable 4xx: definitive; stored and replayed."""
    MISMATCH = "mismatch"
    """The provider says this key was used with another request: definitive."""
    RETRY = "retry"
    """Transient; try again under the same key."""
    REFUSED = "refused"
    """Refused before execution (credentials, permission): not final, not worth retrying
    until the caller fixes its key."""
    NOT_SENT = "not sent"
    """The HTTP stack refused to send it at all (an invalid URL or header): nothing left,
    and the same request would be refused again."""


@attrs.frozen
class Verdict:
    outcome: Outcome
    ambiguous: bool
    """True when the provider may have executed the request despite the failure."""
    retry_after: float | None = None
    reason: str = ""
    diagnosis: str | None = None
    """What the attempt record keeps about an answer that was not the provider's."""


class AnswerRules(Protocol):
    """What classifying an answer asks of a provider profile (``ProviderProfile``)."""

    @property
    def answer_media_types(self) -> frozenset[str]: ...
    @property
    def refused_statuses(self) -> frozenset[int]: ...
    @property
    def mismatch_statuses(self) -> frozenset[int]: ...
    @property
    def in_flight_statuses(self) -> frozenset[int]: ...
    @property
    def not_executed_statuses(self) -> frozenset[int]: ...
    @property
    def retryable_statuses(self) -> frozenset[int]: ...
    @property
    def should_retry_hint(self) -> Callable[[httpx.Response], bool | None]: ...
    @property
    def refine(self) -> Callable[[httpx.Response], Verdict | None]: ...


def _media_type(response: httpx.Response) -> str:
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower()


def _to_head(response: httpx.Response) -> bool:
    try:
        return response.request.method == "HEAD"
    except RuntimeError:  # a response built without its request
        return False


_BODILESS = frozenset({204, 205, 304})
"""Answers that carry no content (RFC 9110): an empty body is all they can have."""


def _not_genuine(
    response: httpx.Response, profile: AnswerRules, *, refusal: bool = False
) -> str | None:
    """Why an answer is not the provider's own, or None when it is.

    ``refusal``: the answer would settle the intent as failed. An empty, typeless 2xx has
    nothing that could be misread (a 204), but an empty, typeless refusal is not one any
    built-in provider writes (they all explain a refusal in a JSON body): it cannot tell a
    proxy's bare 404 or 413 from the provider's, so it proves no refusal.
    """
    accepted = profile.answer_media_types
    if not accepted:
        return None
    body = response.content
    media_type = _media_type(response)
    if (
        not body
        and not refusal
        and (response.status_code in _BODILESS or _to_head(response))
        and media_type in ("", *accepted)
    ):
        return None  # no content by definition, labelled as the provider labels answers
    if not body and not media_type:
        return "an empty, typeless answer" if refusal else None
    json_expected = "application/json" in accepted
    if media_type not in accepted and not (json_expected and media_type.endswith("+json")):
        return f"a {media_type or 'typeless'} answer"
    if json_expected and (media_type == "application/json" or media_type.endswith("+json")):
        try:
            json.loads(body)
        except ValueError:
            return "a body that is not JSON"
    return None


def _as_is(text: str) -> str:
    return text


Redact = Callable[[str], str]
"""What the words of an answer pass through before they are kept (the client's secrets out)."""


def _diagnosis(response: httpx.Response, why: str, redact: Redact) -> str:
    # Redacted whole, then cut: a secret the cut went through would no longer be whole.
    head = redact(response.content.decode("utf-8", "replace"))[:80]
    return f"not the provider's answer: {why}, {len(response.content)} bytes: {head!r}"


def _foreign(response: httpx.Response, why: str, redact: Redact) -> Verdict:
    # A proxy's, a load balancer's or a captive portal's page proves neither that the
    # payment ran nor that it did not (the attempt before it may have executed): ambiguous,
    # retried under the same key, and reconciled if it persists.
    return Verdict(
        Outcome.RETRY,
        ambiguous=True,
        reason=f"HTTP {response.status_code}, not the provider's answer ({why})",
        diagnosis=_diagnosis(response, why, redact),
    )


def _refusal(
    response: httpx.Response, profile: AnswerRules, verdict: Verdict, redact: Redact
) -> Verdict:
    """``verdict`` (failed or mismatch) if the provider wrote this refusal, else ambiguous.

    Settled as failed, an intent tells its caller to use a new reference: after a first
    attempt whose answer was lost, a load balancer's 404 would make that a second payment.
    """
    why = _not_genuine(response, profile, refusal=True)
    return verdict if why is None else _foreign(response, why, redact)


def retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait from an answer's Retry-After: delta-seconds, or an HTTP-date counted
    from the answer's own ``Date``. Both dates are the provider's clock, so a local clock
    off by minutes cannot stretch or cut the wait; without a ``Date`` there is no telling
    (None: the retry policy's own backoff)."""
    value = response.headers.get("retry-after")
    sent = response.headers.get("date")
    try:
        now = None if sent is None else email.utils.parsedate_to_datetime(sent).timestamp()
    except (TypeError, ValueError):
        now = None
    return parse_retry_after(value, now=now)


def parse_retry_after(value: str | None, *, now: float | None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds, or an HTTP-date counted
    from ``now`` (None: an HTTP-date cannot be told, None)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None or now is None:
            return None
        seconds = when.timestamp() - now
    if seconds != seconds:  # NaN
        return None
    return max(seconds, 0.0)


def classify_response(
    response: httpx.Response, profile: AnswerRules, *, redact: Redact = _as_is
) -> Verdict:
    """The verdict on one attempt's answer: settle it, or retry under the same key.
    ``redact``: what the excerpt of an answer that is not the provider's passes through."""
    refined = profile.refine(response)
    if refined is not None:
        return refined
    status = response.status_code
    if status in profile.refused_statuses:
        # Whatever hint comes with it: an authentication refusal executed nothing, and the
        # same request with a working key must still be possible under the same key. Not
        # retried either way; but one the provider did not write (a firewall's page, which
        # may block an answer after the provider ran the request) proves nothing executed:
        # its attempt may have, and the key's age then rules any resend.
        why = _not_genuine(response, profile, refusal=True)
        if why is not None:
            return Verdict(
                Outcome.REFUSED,
                ambiguous=True,
                reason=f"HTTP {status} refused, not the provider's answer ({why})",
                diagnosis=_diagnosis(response, why, redact),
            )
        return Verdict(Outcome.REFUSED, ambiguous=False, reason=f"HTTP {status} refused")
    hint = profile.should_retry_hint(response)
    if 200 <= status < 300:
        why = _not_genuine(response, profile)
        if why is not None:
            return _foreign(response, why, redact)
        return Verdict(Outcome.SUCCEEDED, ambiguous=False, reason=f"HTTP {status}")
    if hint is False:
        # The provider's own header (no proxy writes Stripe-Should-Retry): its word.
        return Verdict(Outcome.FAILED, ambiguous=False, reason=f"HTTP {status} (do not retry)")
    if status in profile.mismatch_statuses:
        mismatch = Verdict(Outcome.MISMATCH, ambiguous=False, reason=f"HTTP {status} key mismatch")
        return _refusal(response, profile, mismatch, redact)
    wait = retry_after(response)
    if status in profile.in_flight_statuses:
        # Another request with our key is executing at the provider: it may well succeed.
        return Verdict(
            Outcome.RETRY,
            ambiguous=True,
            retry_after=wait,
            reason=f"HTTP {status} in flight",
        )
    if status in profile.not_executed_statuses:
        return Verdict(Outcome.RETRY, ambiguous=False, retry_after=wait, reason=f"HTTP {status}")
    if status in profile.retryable_statuses or hint is True:
        # A 5xx may come after the provider executed the payment (a lost success).
        return Verdict(Outcome.RETRY, ambiguous=True, retry_after=wait, reason=f"HTTP {status}")
    if 300 <= status < 500:
        failed = Verdict(Outcome.FAILED, ambiguous=False, reason=f"HTTP {status}")
        return _refusal(response, profile, failed, redact)
    return Verdict(Outcome.RETRY, ambiguous=True, retry_after=wait, reason=f"HTTP {status}")


# Failures that happen before a byte of the request is written: the request never left.
_NEVER_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)
# The HTTP stack refused the request before writing it: nothing left, nothing to retry.
_REFUSED_LOCALLY: tuple[type[Exception], ...] = (
    httpx.LocalProtocolError,
    httpx.UnsupportedProtocol,
    httpx.InvalidURL,
)
_AMBIGUOUS: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


def _certificate_failure(error: BaseException) -> str | None:
    """What a failed TLS certificate check said, when that is why the connection failed."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen.verify_message or str(seen)
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    return text if "CERTIFICATE_VERIFY_FAILED" in text else None


def classify_error(error: BaseException) -> Verdict | None:
    """A verdict for a transport error, or None when it is not a transport failure."""
    name = type(error).__name__
    if isinstance(error, httpx.ConnectError) and (why := _certificate_failure(error)):
        # Said plainly: "ConnectError" alone sends an operator looking at the network.
        reason = f"the provider's TLS certificate failed verification: {why} (request not sent)"
        return Verdict(Outcome.RETRY, ambiguous=False, reason=reason)
    if isinstance(error, _NEVER_SENT):
        return Verdict(Outcome.RETRY, ambiguous=False, reason=f"{name} (request not sent)")
    if isinstance(error, _REFUSED_LOCALLY):
        return Verdict(Outcome.NOT_SENT, ambiguous=False, reason=f"{name} (request not sent)")
    if isinstance(error, _AMBIGUOUS):
        return Verdict(Outcome.RETRY, ambiguous=True, reason=name)
    if isinstance(error, httpx.DecodingError):
        # An answer arrived, so the provider may have executed the request; its body could
        # not be decoded (a proxy labelled it gzip and it is not): an unreadable answer.
        reason = f"{name}: an answer arrived that could not be decoded ({error!s:.80})"
        return Verdict(Outcome.RETRY, ambiguous=True, reason=reason)
    return None


# -- status look-ups (reconciliation) ----------------------------------------------------

LOOKUP_FAILURES: tuple[type[Exception], ...] = (httpx.TransportError, httpx.DecodingError)
"""What a status look-up's exchange may raise instead of answering: asked again later."""


class LookupKind(enum.Enum):
    FOUND = "found"
    """One record in a final status: settles the intent."""
    ABSENT = "absent"
    """The provider has no record of the intent."""
    UNDECIDED = "still_unknown"
    """A record that settles nothing (not final yet, several records)."""
    UNREADABLE = "error"
    """An answer payonce cannot read: nothing is concluded."""
    REFUSED = "refused"
    """The provider refused the look-up itself (a 4xx other than 404)."""
    RETRY = "retry"
    """Transient (429, 5xx, a transport failure): ask again."""


class LookupRules(Protocol):
    """What reading a status look-up's answer asks of a profile's ``Lookup``."""

    @property
    def list_field(self) -> str: ...
    @property
    def status_field(self) -> str: ...
    @property
    def succeeded(self) -> frozenset[str]: ...
    @property
    def failed(self) -> frozenset[str]: ...
    @property
    def creation_only(self) -> Callable[[str, str, bytes], bool]: ...
    @property
    def finds(self) -> Callable[[str, str], bool]: ...
    @property
    def by(self) -> str:
        """``"key"`` or ``"reference"``: what the look-up finds an intent by."""
        ...


class LookedUpRequest(Protocol):
    """The journaled request a look-up is about (an intent's record)."""

    @property
    def method(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def body(self) -> bytes: ...


class ReconcileOutcome(enum.StrEnum):
    """What a status look-up came to, as a reconciliation reports and the journal keeps it.
    A ``str``: each member equals (and prints as) its value."""

    FOUND = "found"
    """The provider's record settled the intent."""
    NOT_FOUND = "not_found"
    """The provider has no record: back to pending when the key is still valid."""
    CANNOT_TELL = "cannot_tell"
    """The look-up cannot see this kind of request (a Stripe confirm or capture: its search
    finds only creations), so its empty answer proves nothing either way. Back to pending
    when the key is still valid (a resend under it cannot execute twice), else it stays
    unknown for a person to check the object at the provider."""
    STILL_UNKNOWN = "still_unknown"
    """A record that settles nothing yet, or an earlier attempt that may still be running."""
    ERROR = "error"
    """No usable answer (a failed, refused or unreadable look-up): nothing concluded."""
    SKIPPED = "skipped"
    """Not looked up (not unknown, another provider's, leased by a worker)."""
    RESENT = "resent"
    """No status look-up to ask with, the key still within its lifetime: resent under it
    (the provider replays what it executed, or executes it once)."""


@attrs.frozen
class LookupVerdict:
    kind: LookupKind
    detail: str
    state: IntentState | None = None
    """For ``FOUND``: succeeded or failed."""
    record: dict[str, Any] | None = None
    """For ``FOUND``: the provider's record, stored as the intent's response."""
    sees: bool = True
    """False when the look-up cannot see the request at all (``Lookup.finds``): then an
    ``ABSENT`` answer proves nothing, and is reported as ``cannot_tell``."""


def classify_lookup(
    response: httpx.Response, lookup: LookupRules, request: LookedUpRequest | None = None
) -> LookupVerdict:
    """The verdict on a status look-up's answer about ``request``'s intent."""
    status = response.status_code
    if status == 429 or status >= 500:
        return LookupVerdict(LookupKind.RETRY, f"HTTP {status}")
    if status == 404:
        # A look-up answers a list, empty when there is no record: a 404 is the endpoint
        # missing (a fake without the search API, a wrong path), which proves nothing.
        detail = "the status look-up endpoint answered 404: it does not exist there"
        return LookupVerdict(LookupKind.UNREADABLE, detail)
    if not 200 <= status < 300:
        return LookupVerdict(LookupKind.REFUSED, f"status look-up refused: HTTP {status}")
    try:
        items = json.loads(response.content)[lookup.list_field]
    except (ValueError, KeyError, TypeError) as exc:
        items = f"{type(exc).__name__}"
    if not isinstance(items, list):
        detail = f"unreadable status look-up answer ({items!s:.40}); still unknown"
        return LookupVerdict(LookupKind.UNREADABLE, detail)
    if not items:
        sees = request is None or lookup.finds(request.method, urlsplit(request.url).path)
        return LookupVerdict(LookupKind.ABSENT, _absent_detail(request, lookup), sees=sees)
    if len(items) > 1:
        detail = f"the provider has {len(items)} records for this intent; check them by hand"
        return LookupVerdict(LookupKind.UNDECIDED, detail)
    (item,) = items
    provider_status = str(item.get(lookup.status_field)) if isinstance(item, dict) else None
    if isinstance(item, dict) and provider_status in lookup.succeeded:
        state = IntentState.SUCCEEDED
    elif isinstance(item, dict) and provider_status in lookup.failed:
        state = IntentState.FAILED
    elif isinstance(item, dict) and request is not None and _created_only(request, lookup):
        # A request that only creates the object (a step before its confirmation) did all it
        # asked once the object exists, whatever its status (``requires_confirmation``).
        detail = f"the provider has the object it created, status {provider_status!r}"
        return LookupVerdict(LookupKind.FOUND, detail, state=IntentState.SUCCEEDED, record=item)
    else:
        detail = f"the provider's record is {provider_status!r}, not final yet; still unknown"
        return LookupVerdict(LookupKind.UNDECIDED, detail)
    detail = f"the provider has the record, status {provider_status!r}"
    return LookupVerdict(LookupKind.FOUND, detail, state=state, record=item)


def _absent_detail(request: LookedUpRequest | None, lookup: LookupRules) -> str:
    if request is None:
        return "the provider has no record"
    path = urlsplit(request.url).path
    if lookup.finds(request.method, path):
        return "the provider has no record"
    # Still absent for what follows (a resend under the same key within its lifetime is
    # safe whatever happened), but a person reading the reason must not take it for "never
    # executed".
    return (
        f"the status look-up cannot see a {request.method} {path} (it finds only requests "
        "that create an object), so its empty answer proves nothing: check the object at "
        "the provider"
    )


def _created_only(request: LookedUpRequest, lookup: LookupRules) -> bool:
    return lookup.creation_only(request.method, urlsplit(request.url).path, request.body)


def classify_lookup_error(error: BaseException) -> LookupVerdict | None:
    """A look-up is a GET that executes nothing: every transport failure, and an answer
    that could not be decoded, is worth asking again. None for anything else."""
    if isinstance(error, LOOKUP_FAILURES):
        return LookupVerdict(LookupKind.RETRY, type(error).__name__)
    return None
