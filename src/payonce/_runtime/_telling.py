"""What a drive of an intent tells: the records its hooks get and the lines it logs.

``IntentCore`` carries out each of a drive's commands, then tells what came of it through
its ``tell``, a ``Teller``. A record costs a dict and an object and a log line's ``extra=``
a dict, so callers test ``hooks`` (False without hooks) or the log level first, as
``HookSet`` asks: a client nobody watches pays for neither.
"""

from __future__ import annotations

import logging

import httpx

from .._lifecycle import (
    IntentRecord,
    LookupKind,
    ReconcileOutcome,
    Transition,
    Verdict,
    step_of_reference,
)
from .._lifecycle._drive import Run
from .._lifecycle._key_age import ASSUMED_LIFETIME_RESEND_WINDOW
from .._lifecycle._refusals import unknown_remedy
from .._providers._profile import ProviderProfile
from ._events import (
    AttemptEnded,
    AttemptStarted,
    IntentEnded,
    IntentReplayed,
    IntentSettled,
    IntentStarted,
    IntentUnknown,
    LookupEnded,
    RetryEvent,
    about,
    log_extra,
)
from ._hooks import Hooks, HookSet
from ._responses import elapsed

__all__ = ["Teller", "logger"]

logger = logging.getLogger("payonce")

_LOOKUP_OUTCOMES = {
    LookupKind.ABSENT: "not_found",
    LookupKind.UNDECIDED: "still_unknown",
    LookupKind.UNREADABLE: "error",
}


class Teller:
    """The hooks' records and the log lines of one client's drives."""

    def __init__(self, hooks: HookSet, profile: ProviderProfile) -> None:
        self.hooks = hooks
        self.profile = profile

    # -- a drive -----------------------------------------------------------------------------

    def drive_started(self, run: Run) -> None:
        """Both clients call this as a drive of ``run`` begins, and ``drive_ended`` after."""
        if self.hooks:
            event = IntentStarted(**about(run.record), resumed=run.resumed)
            self.hooks.emit(Hooks.intent_started, event)

    def drive_ended(self, run: Run) -> None:
        if self.hooks:
            record = run.record
            event = IntentEnded(**about(record), state=record.state, attempts=run.attempt)
            self.hooks.emit(Hooks.intent_ended, event)

    # -- one attempt -------------------------------------------------------------------------

    def attempt_started(self, run: Run) -> None:
        event = AttemptStarted(**about(run.record), attempt=run.attempt)
        self.hooks.emit(Hooks.attempt_started, event)

    def attempt_ended(
        self, run: Run, transition: Transition, status_code: int | None, error: str | None
    ) -> None:
        event = AttemptEnded(
            **about(run.record),
            attempt=run.attempt,
            outcome=transition.value,
            status_code=status_code,
            error=error,
        )
        self.hooks.emit(Hooks.attempt_ended, event)

    @staticmethod
    def log_answer(run: Run, status_code: int, verdict: Verdict) -> None:
        logger.debug(
            "intent %s attempt %d: HTTP %d (%s)",
            run.key,
            run.attempt,
            status_code,
            verdict.outcome.value,
            extra=log_extra(run.record),
        )

    @staticmethod
    def log_error(run: Run, error: BaseException) -> None:
        logger.debug(
            "intent %s attempt %d: %s",
            run.key,
            run.attempt,
            type(error).__name__,
            extra=log_extra(run.record),
        )

    @staticmethod
    def log_refused(run: Run, status_code: int, *, executed: bool) -> None:
        logger.warning(
            "intent %s: refused with HTTP %d %s; it stays pending",
            run.key,
            status_code,
            "by something that is not the provider, and may have executed"
            if executed
            else "before execution",
            extra=log_extra(run.record),
        )

    def retrying_after(self, run: Run, seconds: float, verdict: Verdict) -> None:
        """Before the wait that follows a retryable attempt."""
        if not (self.hooks or logger.isEnabledFor(logging.DEBUG)):
            return
        retry = RetryEvent(
            **about(run.record),
            attempt=run.attempt,
            wait=seconds,
            reason=verdict.reason,
            ambiguous=verdict.ambiguous,
        )
        logger.debug(
            "intent %s: retrying in %.3fs after %s",
            retry.key,
            seconds,
            retry.reason,
            extra=log_extra(run.record),
        )
        if self.hooks:
            self.hooks.emit(Hooks.retrying, retry)

    def lookup_ended(
        self,
        record: IntentRecord,
        kind: LookupKind | None,
        response: httpx.Response | None,
        *,
        before_resend: bool,
        sees: bool = True,
    ) -> None:
        """Tell the hooks of a look-up's answer (``kind`` None: it got none; ``sees``
        False: the look-up cannot see the request, so "no record" is ``cannot_tell``)."""
        if self.hooks:
            if kind is None:
                outcome = "error"
            elif kind is LookupKind.ABSENT and not sees:
                outcome = ReconcileOutcome.CANNOT_TELL.value
            else:
                outcome = _LOOKUP_OUTCOMES.get(kind, kind.value)
            event = LookupEnded(
                **about(record),
                outcome=outcome,
                status_code=None if response is None else response.status_code,
                before_resend=before_resend,
                elapsed=None if response is None else elapsed(response),
            )
            self.hooks.emit(Hooks.lookup_ended, event)

    # -- how it ended ------------------------------------------------------------------------

    @staticmethod
    def log_settled(record: IntentRecord, status_code: int) -> None:
        logger.info(
            "intent %s%s %s after %d attempt(s): HTTP %d",
            record.key,
            f" ({record.reference})" if record.reference else "",
            record.state.value,
            record.attempt_count,
            status_code,
            extra=log_extra(record),
        )

    def settled(self, record: IntentRecord, *, provider_replayed: bool) -> None:
        if self.hooks:
            answer = record.response
            event = IntentSettled(
                **about(record),
                state=record.state,
                status_code=answer.status if answer else None,
                attempts=record.attempt_count,
                provider_replayed=provider_replayed,
            )
            self.hooks.emit(Hooks.settled, event)

    def answered_from_journal(self, record: IntentRecord, status_code: int) -> None:
        event = IntentReplayed(**about(record), state=record.state, status_code=status_code)
        self.hooks.emit(Hooks.replayed, event)

    def went_unknown(self, record: IntentRecord, reason: str, *, key_gone: bool = False) -> None:
        """``key_gone``: it went unknown because a resend is no longer safe, so the advice
        is the one past the key window."""
        # An operator must hear of it without debug logging: money may have moved.
        logger.warning(
            "intent %s%s went unknown: %s. %s",
            record.key,
            f" ({record.reference})" if record.reference else "",
            reason,
            unknown_remedy(
                record.key,
                reconcilable=self.profile.lookup is not None,
                key_gone=key_gone,
                step=step_of_reference(record.reference) is not None,
                automatic_window=(
                    None if self.profile.key_lifetime_documented else ASSUMED_LIFETIME_RESEND_WINDOW
                ),
            ),
            extra=log_extra(record),
        )
        if self.hooks:
            self.hooks.emit(Hooks.unknown, IntentUnknown(**about(record), reason=reason))
