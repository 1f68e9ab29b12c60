"""Everything the clients decide, without doing any I/O but journal calls.

``Client`` and ``AsyncClient`` differ only in how they send bytes and how they sleep; every
decision (what to journal when, what to retry, what to replay, what to raise) lives here.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import httpx
import tenacity

from ._crash import crash_armed, crash_atrace, crash_point, crash_trace
from ._intent import CanonicalRequest, IntentState, KeyFormat, make_scope, new_key, validate_key
from ._journal import (
    Claim,
    ClaimKind,
    IntentDraft,
    IntentRecord,
    IntentStore,
    StoredResponse,
)
from ._lease import new_owner, owner_is_dead
from ._providers import ProviderProfile
from ._retry import Outcome, RetryPolicy, Verdict, classify_error, classify_response
from ._version import __version__
from .errors import (
    IntentInFlight,
    IntentMismatch,
    IntentStateError,
    OutcomeUnknown,
    PayonceError,
    ProviderError,
    ProviderUnavailable,
)

__all__ = [
    "IntentCore",
    "Replay",
    "ResponseInfo",
    "ResumeResult",
    "RetryEvent",
    "Run",
    "Wait",
    "new_owner",
    "response_info",
]

logger = logging.getLogger("payonce")

DEFAULT_MAX_STORED_BYTES = 1024 * 1024
KEY_LIFETIME_MARGIN = 0.1
"""Resend only while the first attempt is younger than 90% of the provider's key lifetime."""

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
    """True when served from the journal without a network call."""
    provider_replayed: bool
    """True when the provider said it replayed a stored answer for this key."""
    attempts: int
    body_stored: bool
    """False when the body exceeded the size cap and only status and headers were kept."""


def response_info(response: httpx.Response) -> ResponseInfo | None:
    """payonce's record of a response, or None for a response payonce did not produce."""
    info = response.extensions.get("payonce")
    return info if isinstance(info, ResponseInfo) else None


@attrs.frozen
class RetryEvent:
    """Handed to ``on_retry`` hooks before payonce waits to retry an intent."""

    key: str
    reference: str | None
    attempt: int
    """The attempt that just failed (1-based)."""
    wait: float
    reason: str
    ambiguous: bool


@attrs.frozen
class ResumeResult:
    """What ``resume`` did with one pending intent."""

    key: str
    reference: str | None
    state: IntentState
    detail: str


class _Retry(Exception):
    """Internal: the attempt ended in a retryable way."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


@attrs.define(eq=False)
class Run:
    """One drive of one intent by one worker: holds the lease while it lasts."""

    record: IntentRecord
    owner: str
    attempt: int
    ambiguous: bool
    """True once any attempt of this intent may have reached the provider."""
    started: bool = True
    """False until the current attempt's start is journaled (the first one is, by claim)."""
    last_reason: str = ""

    @property
    def key(self) -> str:
        return self.record.key


@attrs.frozen
class Replay:
    record: IntentRecord
    response: httpx.Response


@attrs.frozen
class Wait:
    record: IntentRecord


Step = Run | Replay | Wait


class IntentCore:
    """The decisions shared by Client and AsyncClient."""

    def __init__(
        self,
        *,
        base_url: str,
        profile: ProviderProfile,
        account: str,
        api_key: str,
        journal: IntentStore,
        retry: RetryPolicy,
        key_format: KeyFormat,
        max_stored_bytes: int,
        lease_seconds: float,
        clock: Callable[[], float],
        on_retry: Callable[[RetryEvent], None] | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.profile = profile
        self.account = account
        self._api_key = api_key
        self.journal = journal
        self.retry = retry
        self.key_format = key_format
        self.max_stored_bytes = max_stored_bytes
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.on_retry = on_retry

    # -- the intent --------------------------------------------------------------------------

    def draft(
        self,
        canonical: CanonicalRequest,
        *,
        reference: str | None,
        key: str | None,
        key_supplied: bool,
        headers: Mapping[str, str] | None,
    ) -> IntentDraft:
        if key is not None:
            validate_key(key, max_length=self.profile.key_max_length)
        secret = self.profile.secret_headers() | {self.profile.key_header.lower()}
        kept = sorted(
            (name.lower(), value)
            for name, value in (headers or {}).items()
            if name.lower() not in secret and name.lower() != "content-type"
        )
        fingerprint = canonical.fingerprint
        if kept:
            # Headers such as Stripe-Account change what the request does: the same intent
            # with other headers is another request. Without any, fingerprints stay as the
            # body alone makes them, so journals written before stay valid.
            digest = hashlib.sha256(fingerprint.encode())
            for name, value in kept:
                digest.update(f"\x00{name}:{value}".encode())
            fingerprint = digest.hexdigest()
        if canonical.content_type:
            kept.append(("content-type", canonical.content_type))
        return IntentDraft(
            key=key or new_key(self.key_format),
            key_supplied=key_supplied,
            scope=make_scope(self.account, canonical.method, canonical.path),
            reference=reference,
            account=self.account,
            provider=self.profile.name,
            method=canonical.method,
            url=self.base_url + canonical.target,
            fingerprint=fingerprint,
            request_headers=tuple(kept),
            body=canonical.body,
        )

    def begin(self, draft: IntentDraft, owner: str) -> Step:
        """Claim the intent; decide whether to send, replay, wait, or refuse."""
        claim = self.journal.claim(
            draft, owner=owner, now=self.clock(), lease_seconds=self.lease_seconds
        )
        if claim.kind is ClaimKind.LEASED and owner_is_dead(claim.record.lease_owner):
            logger.info(
                "intent %s: taking over the lease of dead worker %s",
                claim.record.key,
                claim.record.lease_owner,
            )
            claim = self.journal.claim(
                draft,
                owner=owner,
                now=self.clock(),
                lease_seconds=self.lease_seconds,
                stale_owner=claim.record.lease_owner,
            )
        record = claim.record
        match claim.kind:
            case ClaimKind.CREATED:
                assert claim.attempt_number is not None
                crash_point("after_write_ahead")
                return Run(record, owner, attempt=claim.attempt_number, ambiguous=False)
            case ClaimKind.MISMATCH:
                raise self._mismatch(draft, record)
            case ClaimKind.FINAL:
                return Replay(record, self.replay(record))
            case ClaimKind.UNKNOWN:
                raise self._unknown(record)
            case ClaimKind.LEASED:
                return Wait(record)
            case ClaimKind.CLAIMED:
                return self._resume(claim, owner)

    def _resume(self, claim: Claim, owner: str) -> Run:
        """An existing pending intent: resend under its key unless that key may be gone."""
        record = claim.record
        attempts = self.journal.attempts(record.key)
        ambiguous = any(a.in_flight or a.ambiguous for a in attempts)
        run = Run(record, owner, attempt=0, ambiguous=ambiguous, started=False)
        if ambiguous and record.first_sent_at is not None:
            age = self.clock() - record.first_sent_at
            if age > self.profile.key_lifetime * (1 - KEY_LIFETIME_MARGIN):
                reason = (
                    f"first sent {age:.0f}s ago, beyond the provider's key lifetime of "
                    f"{self.profile.key_lifetime:.0f}s; a resend could execute twice"
                )
                self.journal.mark_unknown(
                    record.key, owner=run.owner, now=self.clock(), reason=reason
                )
                raise self._unknown(attrs.evolve(record, unknown_reason=reason))
        return run

    def claim_next_resumable(self, owner: str, after: tuple[float, str] | None) -> Claim | None:
        """Lease the next pending intent of this account that no live worker holds.

        ``after`` is the (created_at, key) of the intent this pass handled last. Hosts
        resuming at once skip the rows the others are claiming instead of queueing on them.
        """
        return self.journal.claim_next_pending(
            account=self.account,
            provider=self.profile.name,
            owner=owner,
            now=self.clock(),
            lease_seconds=self.lease_seconds,
            after=after,
            is_stale=owner_is_dead,
        )

    def resume_claimed(self, claim: Claim, owner: str) -> Run:
        """The run of an intent ``claim_next_resumable`` leased to ``owner``."""
        return self._resume(claim, owner)

    def resume_result(
        self, record: IntentRecord, response: httpx.Response | None, error: Exception | None
    ) -> ResumeResult:
        """How one resumed intent ended, for the caller and the log."""
        if response is not None:
            state, detail = IntentState.SUCCEEDED, f"HTTP {response.status_code}"
        elif isinstance(error, ProviderError):
            state, detail = IntentState.FAILED, f"HTTP {error.status_code}"
        else:
            current = self.journal.get(record.key)
            state = current.state if current else record.state
            detail = f"{type(error).__name__}: {error}"
        logger.info("resumed intent %s: %s (%s)", record.key, state.value, detail)
        return ResumeResult(record.key, record.reference, state, detail)

    def start_attempt(self, run: Run) -> None:
        if run.started:
            return
        run.attempt = self.journal.start_attempt(
            run.key, owner=run.owner, now=self.clock(), lease_seconds=self.lease_seconds
        )
        run.started = True
        crash_point("after_write_ahead")

    def renew(self, run: Run) -> None:
        """Keep the lease of a slow attempt alive so no other worker takes the intent over."""
        if not self.journal.renew_lease(
            run.key, owner=run.owner, now=self.clock(), lease_seconds=self.lease_seconds
        ):
            logger.warning("intent %s: lease lost while an attempt was in flight", run.key)

    def auth_headers(self) -> dict[str, str]:
        return self.profile.auth_headers(self._api_key)

    # -- one attempt -------------------------------------------------------------------------

    def build_request(self, run: Run, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The same bytes and the same key on every attempt, taken from the journal."""
        record = run.record
        headers = dict(record.request_headers)
        headers[self.profile.key_header] = self.profile.key_header_value(record.key)
        headers.update(self.auth_headers())
        # The path comes from the journal, the host from this client: after a failover or a
        # move to another endpoint, the intent is resent where the provider now answers.
        target = httpx.URL(record.url).raw_path.decode("ascii")
        content_type = dict(record.request_headers).get("content-type")
        return client.build_request(
            record.method,
            self.base_url + target,
            content=self.profile.prepare_body(record.body, content_type, record.key),
            headers=headers,
            extensions=self._crash_extensions(client),
        )

    @staticmethod
    def _crash_extensions(client: httpx.Client | httpx.AsyncClient) -> dict[str, Any] | None:
        if not crash_armed():
            return None
        return {"trace": crash_atrace if isinstance(client, httpx.AsyncClient) else crash_trace}

    def on_response(self, run: Run, response: httpx.Response) -> httpx.Response:
        """Settle a definitive answer, or raise ``_Retry`` for a transient one."""
        crash_point("after_response")
        verdict = classify_response(response, self.profile)
        logger.debug(
            "intent %s attempt %d: HTTP %d (%s)",
            run.key,
            run.attempt,
            response.status_code,
            verdict.outcome.value,
        )
        if verdict.outcome is Outcome.RETRY:
            self._retryable(run, verdict, status_code=response.status_code, error=None)
        return self._settle(run, response, verdict)

    def on_error(self, run: Run, error: BaseException) -> None:
        """An attempt raised: retry transport failures, journal anything else and re-raise."""
        verdict = classify_error(error)
        logger.debug("intent %s attempt %d: %s", run.key, run.attempt, type(error).__name__)
        if verdict is not None:
            self._retryable(run, verdict, status_code=None, error=type(error).__name__)
        # Not a transport failure (a bug, an interrupt): the attempt may have left. Leave the
        # intent pending under its key, so a later call resends it safely within the
        # provider's key lifetime, and let the error through.
        self.journal.end_attempt(
            run.key,
            run.attempt,
            owner=run.owner,
            now=self.clock(),
            status_code=None,
            error=type(error).__name__,
            ambiguous=True,
        )
        self.journal.release(run.key, owner=run.owner)

    def _retryable(
        self, run: Run, verdict: Verdict, *, status_code: int | None, error: str | None
    ) -> None:
        run.ambiguous = run.ambiguous or verdict.ambiguous
        run.last_reason = verdict.reason
        self.journal.end_attempt(
            run.key,
            run.attempt,
            owner=run.owner,
            now=self.clock(),
            status_code=status_code,
            error=error,
            ambiguous=verdict.ambiguous,
        )
        run.started = False
        raise _Retry(verdict)

    def _settle(self, run: Run, response: httpx.Response, verdict: Verdict) -> httpx.Response:
        body = response.content
        body_stored = len(body) <= self.max_stored_bytes
        if not body_stored:
            logger.warning(
                "intent %s: response body of %d bytes exceeds the %d-byte cap; journaled "
                "status and headers only, a replay will have an empty body",
                run.key,
                len(body),
                self.max_stored_bytes,
            )
        stored = StoredResponse(
            status=response.status_code,
            headers=tuple(
                (name, value)
                for name, value in response.headers.multi_items()
                if name.lower() not in _DROPPED_RESPONSE_HEADERS
            ),
            body=body if body_stored else b"",
            body_stored=body_stored,
        )
        state = (
            IntentState.SUCCEEDED if verdict.outcome is Outcome.SUCCEEDED else IntentState.FAILED
        )
        record = self.journal.settle(
            run.key,
            owner=run.owner,
            now=self.clock(),
            state=state,
            response=stored,
            attempt=run.attempt,
        )
        logger.info(
            "intent %s%s %s after %d attempt(s): HTTP %d",
            record.key,
            f" ({record.reference})" if record.reference else "",
            state.value,
            record.attempt_count,
            response.status_code,
        )
        response.extensions = {
            **response.extensions,
            "payonce": ResponseInfo(
                key=record.key,
                reference=record.reference,
                state=state,
                replayed=False,
                provider_replayed=self.profile.was_replayed(response),
                attempts=record.attempt_count,
                body_stored=body_stored,
            ),
        }
        return self._deliver(record, response)

    # -- giving up, replaying, refusing ------------------------------------------------------

    def give_up(self, run: Run) -> PayonceError:
        """Attempts ran out: the error to raise, after journaling what is known."""
        if run.ambiguous:
            reason = f"retries exhausted; last failure: {run.last_reason}"
            record = self.journal.mark_unknown(
                run.key, owner=run.owner, now=self.clock(), reason=reason
            )
            return self._unknown(record)
        self.journal.release(run.key, owner=run.owner)
        return ProviderUnavailable(
            f"intent {run.key}{_ref(run.record.reference)} was never executed by the "
            f"provider ({run.last_reason}); it stays pending under its key: calling again "
            "later is safe",
            key=run.key,
            reference=run.record.reference,
        )

    def replay(self, record: IntentRecord) -> httpx.Response:
        if record.state is IntentState.ABANDONED:
            raise IntentStateError(
                f"intent {record.key}{_ref(record.reference)} was abandoned by an operator "
                f"({record.abandon_reason}); it is never resent. Use a new reference to pay "
                "again",
                key=record.key,
                reference=record.reference,
            )
        stored = record.response
        if stored is None:
            raise OutcomeUnknown(
                f"intent {record.key}{_ref(record.reference)} is {record.state.value} with no "
                "stored response",
                key=record.key,
                reference=record.reference,
                reason=record.unknown_reason or record.state.value,
            )
        response = httpx.Response(
            stored.status,
            headers=list(stored.headers),
            content=stored.body,
            request=httpx.Request(record.method, record.url),
            extensions={
                "payonce": ResponseInfo(
                    key=record.key,
                    reference=record.reference,
                    state=record.state,
                    replayed=True,
                    provider_replayed=False,
                    attempts=record.attempt_count,
                    body_stored=stored.body_stored,
                )
            },
        )
        logger.debug("intent %s replayed from the journal: HTTP %d", record.key, stored.status)
        return self._deliver(record, response)

    def _deliver(self, record: IntentRecord, response: httpx.Response) -> httpx.Response:
        if record.state is IntentState.SUCCEEDED:
            return response
        # The profile's verdict, not the bare status: Stripe's mismatch is a 400 that only
        # its body tells apart, and a Mollie or Adyen 422 is a validation error.
        if classify_response(response, self.profile).outcome is Outcome.MISMATCH:
            raise IntentMismatch(
                f"the provider refused intent {record.key}{_ref(record.reference)}: it holds "
                f"this key for a different request (HTTP {response.status_code}). Use a new "
                "reference for a new operation",
                key=record.key,
                reference=record.reference,
                stored_fingerprint="(provider)",
                new_fingerprint=record.fingerprint,
            )
        raise ProviderError(
            f"the provider refused intent {record.key}{_ref(record.reference)} with HTTP "
            f"{response.status_code}; the refusal is journaled and will be replayed for this "
            "intent. Use a new reference to try a different request",
            key=record.key,
            reference=record.reference,
            response=response,
        )

    def in_flight(self, record: IntentRecord) -> IntentInFlight:
        return IntentInFlight(
            f"intent {record.key}{_ref(record.reference)} is being sent by another worker "
            f"({record.lease_owner}); wait for it, or call again to get its stored outcome",
            key=record.key,
            reference=record.reference,
        )

    def _unknown(self, record: IntentRecord) -> OutcomeUnknown:
        reason = record.unknown_reason or "outcome unknown"
        return OutcomeUnknown(
            f"the outcome of intent {record.key}{_ref(record.reference)} is unknown ({reason}); "
            f"it will not be resent blindly. Reconcile it: payonce reconcile {record.key}",
            key=record.key,
            reference=record.reference,
            reason=reason,
        )

    def _mismatch(self, draft: IntentDraft, record: IntentRecord) -> IntentMismatch:
        if draft.key_supplied and record.key != draft.key:
            what = f"reference {draft.reference!r} is bound to key {record.key}, not {draft.key}"
        elif record.scope != draft.scope:
            what = f"key {record.key} belongs to {record.scope!r}, not {draft.scope!r}"
        else:
            what = "the request differs from the one first journaled for it"
        return IntentMismatch(
            f"intent {record.key}{_ref(record.reference)}: {what} (stored fingerprint "
            f"{record.fingerprint[:16]}…, new {draft.fingerprint[:16]}…). Nothing was sent. "
            "Use a new reference for a new operation",
            key=record.key,
            reference=record.reference,
            stored_fingerprint=record.fingerprint,
            new_fingerprint=draft.fingerprint,
        )

    # -- the retry loop's settings, shared by both loops -------------------------------------

    def retrying_kwargs(self, run: Run | None) -> dict[str, Any]:
        """tenacity settings; ``run`` is None for a status look-up (no retry events)."""
        policy = self.retry

        def wait(state: tenacity.RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            retry_after = error.verdict.retry_after if isinstance(error, _Retry) else None
            return policy.wait(state.attempt_number, retry_after)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            if not isinstance(error, _Retry) or run is None:
                return
            seconds = state.next_action.sleep if state.next_action else 0.0
            logger.debug("intent %s: retrying in %.3fs after %s", run.key, seconds, error)
            if self.on_retry is not None:
                self.on_retry(
                    RetryEvent(
                        key=run.key,
                        reference=run.record.reference,
                        attempt=run.attempt,
                        wait=seconds,
                        reason=error.verdict.reason,
                        ambiguous=error.verdict.ambiguous,
                    )
                )

        return {
            "stop": tenacity.stop_after_attempt(policy.max_attempts)
            | tenacity.stop_before_delay(policy.max_elapsed),
            "wait": wait,
            "retry": tenacity.retry_if_exception_type(_Retry),
            "before_sleep": before_sleep,
            "reraise": True,
        }


def _ref(reference: str | None) -> str:
    return f" (reference {reference!r})" if reference else ""


USER_AGENT = f"payonce/{__version__}"
RetryExhausted = _Retry
"""Raised out of the retry loop when attempts ran out; the clients turn it into ``give_up``."""
