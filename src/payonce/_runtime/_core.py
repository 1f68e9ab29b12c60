"""Everything the clients decide per intent, doing no I/O but journal calls.

``Client`` and ``AsyncClient`` differ only in how they send bytes, sleep and wait; they
call these steps in the same order. Which state an answer leads to is decided in
``payonce._lifecycle``; the words of each error are in ``_refusals``; what each step tells
the hooks and the log is in ``_telling``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

import attrs
import httpx

from .._crash import crash_armed, crash_atrace, crash_point, crash_trace
from .._journal._records import Claim, IntentDraft, IntentRecord
from .._journal._store import IntentStore
from .._lifecycle import (
    ClaimKind,
    IntentState,
    KeyFormat,
    Outcome,
    Transition,
    Verdict,
    Verification,
    classify_error,
    classify_response,
    journaled_fingerprint_matches,
    may_have_executed,
    quiet_after,
    resend_refusal,
    transition_for,
)
from .._owners import owner_ended
from .._providers._profile import ProviderProfile
from ..errors import JournalError, PayonceError
from . import _refusals as refusals
from ._drafting import Drafter
from ._events import log_extra
from ._hooks import HookSet
from ._lease_keeper import Lease
from ._redacting import Redactor
from ._responses import replayed, stored, tagged
from ._retrying import Retry, RetryPolicy, retrying_kwargs
from ._telling import Telling, logger

__all__ = ["IntentCore", "Replay", "Run", "Step", "Wait"]


@attrs.define(eq=False)
class Run:
    """One drive of one intent by one worker: holds the lease while it lasts."""

    record: IntentRecord
    """The intent as the last journal write of this run left it."""
    owner: str
    attempt: int
    ambiguous: bool
    """True once any attempt of this intent may have reached the provider."""
    started: bool = True
    """False until the current attempt's start is journaled (the first one is, by claim)."""
    last_reason: str = ""
    verification: Verification | None = None
    """Set after an attempt that may have executed, for a profile that verifies before it
    resends: the look-ups still to make (see ``payonce._lifecycle._verify``)."""
    began: float = attrs.field(factory=time.monotonic)
    """When this drive began: verification waits count against ``max_elapsed`` too."""
    acknowledge_on_success: bool = False
    """Acknowledge in the settle's own transaction if it succeeds: a one-shot call, where
    nothing runs between the answer and the acknowledgement (see ``Client.request``)."""
    resumed: bool = False
    """An intent journaled earlier and still pending, picked up by this run."""

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


class IntentCore(Telling):
    """The decisions shared by Client and AsyncClient; what it tells of them is
    ``Telling``'s."""

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
        hooks: HookSet,
    ) -> None:
        self.base_url = base_url
        self.profile = profile
        self.account = account
        self._api_key = api_key
        self.journal = journal
        self.retry = retry
        self.max_stored_bytes = max_stored_bytes
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.hooks = hooks
        # Fixed for the client's life, so computed once rather than on every intent.
        self._base = httpx.URL(base_url)
        self._own_urls = None if "?" in base_url or "#" in base_url else base_url + "/"
        """What every URL journaled by a client of this base URL starts with."""
        self._auth_headers = profile.auth_headers(api_key)
        self.redactor = Redactor.of([api_key, *self._auth_headers.values()])
        """What an exception's words pass through before a log, a result or the CLI."""
        self.drafter = Drafter(profile, account, base_url, key_format)
        """Turns each request of the client into an intent's draft."""

    # -- the intent --------------------------------------------------------------------------

    def begin(self, draft: IntentDraft, owner: str) -> Step:
        """Claim the intent; decide whether to send, replay, wait, or refuse."""
        # A lease of a worker that provably died is taken over at once (``owner_is_dead``).
        claim = self.journal.claim(
            draft, owner=owner, now=self.clock(), lease_seconds=self.lease_seconds
        )
        record = claim.record
        match claim.kind:
            case ClaimKind.CREATED:
                assert claim.attempt_number is not None
                crash_point("after_write_ahead")
                return Run(record, owner, attempt=claim.attempt_number, ambiguous=False)
            case ClaimKind.MISMATCH:
                raise refusals.mismatch(draft, record, reconcilable=self.reconcilable)
            case ClaimKind.FINAL:
                return Replay(record, self.replay(record))
            case ClaimKind.UNKNOWN:
                raise refusals.unknown(record, reconcilable=self.reconcilable)
            case ClaimKind.LEASED:
                return Wait(record)
            case ClaimKind.CLAIMED:
                return self.resumed(claim, owner)

    def resumed(self, claim: Claim, owner: str) -> Run:
        """An existing pending intent ``owner`` has claimed: resend under its key, unless an
        attempt may have executed and the key may be gone at the provider by now."""
        record = claim.record
        if not self._intact(record):
            self.journal.release(record.key, owner=owner)
            raise JournalError(
                f"intent {record.key}: its journaled request no longer matches the fingerprint "
                "it was journaled with, so the journal was edited by hand or damaged; it is "
                "not sent. Restore the journal from a backup, or check the payment at the "
                "provider and abandon the intent",
                location=self.journal.location,
            )
        attempts = self.journal.attempts(record.key)
        ambiguous = may_have_executed(attempts)
        run = Run(record, owner, attempt=0, ambiguous=ambiguous, started=False, resumed=True)
        until = quiet_after(attempts, self.profile.max_processing)
        if self.profile.verifies and until is not None:
            # After a crash with an attempt in flight, as after a timeout: look before sending.
            run.verification = Verification(until=until)
        refusal = resend_refusal(
            record.first_sent_at, self.clock(), self.profile.key_lifetime, executed=ambiguous
        )
        if refusal is not None:
            run.record = self.journal.mark_unknown(
                record.key,
                transition=Transition.KEY_WINDOW_PASSED,
                owner=owner,
                now=self.clock(),
                reason=refusal,
            )
            self._went_unknown(run.record, refusal)
            raise refusals.unknown(run.record, reconcilable=self.reconcilable)
        return run

    @staticmethod
    def _intact(record: IntentRecord) -> bool:
        path = record.scope[len(record.account) + len(record.method) + 2 :]
        return journaled_fingerprint_matches(
            method=record.method,
            path=path,
            url=record.url,
            request_headers=record.request_headers,
            body=record.body,
            fingerprint=record.fingerprint,
        )

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
        )

    def start_attempt(self, run: Run) -> None:
        if run.started:
            return
        run.attempt = self.journal.start_attempt(
            run.key, owner=run.owner, now=self.clock(), lease_seconds=self.lease_seconds
        )
        run.started = True
        crash_point("after_write_ahead")

    def lease(self, run: Run) -> Lease:
        """The run's lease, for the lease keeper to renew while an attempt waits."""

        def renew() -> bool:
            if self.journal.renew_lease(
                run.key, owner=run.owner, now=self.clock(), lease_seconds=self.lease_seconds
            ):
                return True
            # The keeper renews a snapshot of its leases: this run's own settle may have
            # released the lease meanwhile. Lost means another worker holds it, or took
            # it over and went on with attempts of its own before releasing it.
            current = self.journal.get(run.key)
            if current is None or current.lease_owner not in (None, run.owner):
                return False
            return current.lease_owner == run.owner or current.attempt_count <= run.attempt

        return Lease(f"intent {run.key}", renew, log_extra=log_extra(run.record))

    @property
    def reconcilable(self) -> bool:
        """Whether an unknown intent of this profile can be asked about (a status look-up)."""
        return self.profile.lookup is not None

    @staticmethod
    def run_over(run: Run, failure: BaseException | None) -> None:
        """Both clients call this when a drive of ``run`` has returned or raised ``failure``.

        A drive the journal failed (its settle could not be written: a full disk, a lost
        journal) ended still holding its lease and will never renew or release it: this
        process's next call of the intent may take it at once, and settle it under its key
        as the error advised, rather than be told for a whole lease that "another worker" is
        sending it. Nothing else ends a lease early: a drive cancelled or interrupted while
        its request may still be at the provider, or while a journal call still runs in its
        thread, keeps it until it expires or is given back."""
        if isinstance(failure, JournalError) and run.record.lease_owner == run.owner:
            owner_ended(run.owner)

    def auth_headers(self) -> dict[str, str]:
        return dict(self._auth_headers)

    # -- one attempt -------------------------------------------------------------------------

    def build_request(self, run: Run, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The same bytes and the same key on every attempt, taken from the journal."""
        record = run.record
        headers = dict(record.request_headers)
        content_type = headers.get("content-type")
        headers[self.profile.key_header] = self.profile.key_header_value(record.key)
        headers.update(self._auth_headers)
        if self.hooks:
            self._attempt_started(run)
        return client.build_request(
            record.method,
            self.sent_url(record.url),
            content=self.profile.prepare_body(record.body, content_type, record.key),
            headers=headers,
            extensions=self._crash_extensions(client),
        )

    def sent_url(self, journaled: str) -> httpx.URL | str:
        """Where an intent journaled at ``journaled`` is sent by this client."""
        if self._own_urls is not None and journaled.startswith(self._own_urls):
            # Journaled by a client of this base URL (nearly always): that very URL, which
            # httpx parses once, rather than three parses and a merge to the same result.
            return journaled
        # The path comes from the journal, the host from this client: after a failover or a
        # move to another endpoint, the intent is resent where the provider now answers. The
        # journaled path already holds the base URL's own path (``/v71`` of Adyen's).
        return self._base.copy_with(raw_path=httpx.URL(journaled).raw_path)

    @staticmethod
    def _crash_extensions(client: httpx.Client | httpx.AsyncClient) -> dict[str, Any] | None:
        if not crash_armed():
            return None
        return {"trace": crash_atrace if isinstance(client, httpx.AsyncClient) else crash_trace}

    def on_response(self, run: Run, response: httpx.Response) -> httpx.Response:
        """Settle a definitive answer, or raise ``Retry`` for a transient one."""
        crash_point("after_response")
        verdict = classify_response(response, self.profile, redact=self.redactor.text)
        transition = transition_for(verdict)
        if logger.isEnabledFor(logging.DEBUG):
            self._log_answer(run, response.status_code, verdict)
        diagnosis = verdict.diagnosis  # redacted: a foreign page may quote the request back
        if verdict.outcome is Outcome.RETRY:
            status = response.status_code
            self._retryable(run, verdict, transition, status_code=status, error=diagnosis)
        if verdict.outcome is Outcome.REFUSED:
            status = response.status_code
            self._end_attempt(run, transition, status_code=status, error=diagnosis)
            self._log_refused(run, status, executed=verdict.ambiguous)
            raise refusals.authentication(run.record, response, foreign=verdict.ambiguous)
        return self._settle(run, response, transition)

    def on_error(self, run: Run, error: BaseException) -> None:
        """An attempt raised: retry transport failures, journal anything else and re-raise."""
        verdict = classify_error(error)
        if logger.isEnabledFor(logging.DEBUG):
            self._log_error(run, error)
        if verdict is not None and verdict.outcome is Outcome.NOT_SENT:
            # Provably never left: the intent stays pending, free, and not ambiguous.
            self._end_attempt(run, Transition.ATTEMPT_NOT_SENT, error=type(error).__name__)
            return
        if verdict is not None:
            self._retryable(run, verdict, transition_for(verdict), error=type(error).__name__)
        # Not a transport failure (a bug, an interrupt): the attempt may have left. Leave the
        # intent pending under its key, so a later call resends it safely within the
        # provider's key lifetime, and let the error through.
        self._end_attempt(run, Transition.ATTEMPT_INTERRUPTED, error=type(error).__name__)

    def _end_attempt(
        self,
        run: Run,
        transition: Transition,
        *,
        status_code: int | None = None,
        error: str | None = None,
    ) -> None:
        self.journal.end_attempt(
            run.key,
            run.attempt,
            transition=transition,
            owner=run.owner,
            now=self.clock(),
            status_code=status_code,
            error=error,
        )
        if self.hooks:
            self._attempt_ended(run, transition, status_code, error)

    def _retryable(
        self,
        run: Run,
        verdict: Verdict,
        transition: Transition,
        *,
        status_code: int | None = None,
        error: str | None = None,
    ) -> NoReturn:
        run.ambiguous = run.ambiguous or verdict.ambiguous
        run.last_reason = verdict.reason
        self._end_attempt(run, transition, status_code=status_code, error=error)
        run.started = False
        if verdict.ambiguous and self.profile.verifies:
            run.verification = Verification(until=self.clock() + self.profile.max_processing)
        raise Retry(verdict)

    def _settle(self, run: Run, response: httpx.Response, transition: Transition) -> httpx.Response:
        run.record = record = self.journal.settle(
            run.key,
            transition=transition,
            owner=run.owner,
            now=self.clock(),
            response=stored(response, record=run.record, max_bytes=self.max_stored_bytes),
            attempt=run.attempt,
            acknowledge_success=run.acknowledge_on_success,
        )
        if logger.isEnabledFor(logging.INFO):
            self._log_settled(record, response.status_code)
        provider_replayed = None  # read from the response only if someone asks
        if self.hooks:
            provider_replayed = self.profile.was_replayed(response)
            self._attempt_ended(run, transition, response.status_code, None)
            self.settled(record, provider_replayed=provider_replayed)
        tagged(
            response,
            record,
            replayed=False,
            provider_replayed=provider_replayed,
            profile=self.profile,
        )
        return self.deliver(record, response)

    # -- giving up, replaying ----------------------------------------------------------------

    def give_up(self, run: Run) -> PayonceError:
        """Attempts ran out: the error to raise, after journaling what is known."""
        if run.ambiguous:
            reason = f"retries exhausted; last failure: {run.last_reason}"
            run.record = self.journal.mark_unknown(
                run.key,
                transition=Transition.EXHAUSTED,
                owner=run.owner,
                now=self.clock(),
                reason=reason,
            )
            self._went_unknown(run.record, reason)
            return refusals.unknown(run.record, reconcilable=self.reconcilable)
        # Exhausted, never executed: the intent stays pending and the lease goes.
        self.journal.release(run.key, owner=run.owner)
        return refusals.unavailable(run.record, run.last_reason)

    def replay(self, record: IntentRecord) -> httpx.Response:
        if record.state is IntentState.ABANDONED:
            raise refusals.abandoned(record)
        response = replayed(record)
        if response is None:
            raise refusals.unknown(record, reconcilable=self.reconcilable)
        if self.hooks:
            self._answered_from_journal(record, response.status_code)
        return self.deliver(record, response)

    def deliver(self, record: IntentRecord, response: httpx.Response) -> httpx.Response:
        """The answer of a settled intent: returned when it succeeded, raised otherwise."""
        if record.state is IntentState.SUCCEEDED:
            return response
        raise refusals.refused(
            record, response, classify_response(response, self.profile, redact=self.redactor.text)
        )

    def retrying(self, run: Run | None, began: float | None = None) -> dict[str, Any]:
        """tenacity settings of an intent's attempt loop, or of a look-up's (``run`` None).
        ``began``: when the intent's first attempt started, outside the loop."""
        if run is None:
            return retrying_kwargs(self.retry, began=began)
        event, on_retry = self._retry_events(run)
        return retrying_kwargs(self.retry, event=event, on_retry=on_retry, began=began)
