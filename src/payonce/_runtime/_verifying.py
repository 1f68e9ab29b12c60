"""Verify before resend, for one intent's drive: the steps both clients take between an
attempt that may have executed and the next one (the rule is ``_lifecycle._verify``'s)."""

from __future__ import annotations

import logging
import time

import httpx

from .._lifecycle import (
    IntentState,
    LookUp,
    LookupKind,
    Outcome,
    ReconcileOutcome,
    Transition,
    Verdict,
    Verification,
    classify_lookup,
)
from ._core import IntentCore, Run
from ._events import log_extra
from ._reconcile import looked_up as lookup_ended
from ._responses import from_lookup, replayed, tagged
from ._retrying import Retry

__all__ = ["lookup_failed", "looked_up", "step"]

logger = logging.getLogger("payonce")

_JOURNALED = {
    LookupKind.ABSENT: ReconcileOutcome.NOT_FOUND,
    LookupKind.UNDECIDED: ReconcileOutcome.STILL_UNKNOWN,
}


def step(core: IntentCore, run: Run) -> float | LookUp | None:
    """What to do before the next attempt: None to send it, a number of seconds to wait,
    ``LOOK_UP`` to ask the provider. Raises ``Retry`` once waiting would pass
    ``max_elapsed``: the attempts then end, and the intent goes unknown."""
    verification = run.verification
    if verification is None:
        return None
    next_step = verification.next(core.clock())
    if next_step is None:
        run.verification = None
        logger.info(
            "intent %s: the provider has no record of it; resending",
            run.key,
            extra=log_extra(run.record),
        )
        return None
    if isinstance(next_step, float) and (
        time.monotonic() + next_step > run.began + core.retry.max_elapsed
    ):
        reason = "no look-up could tell whether it executed before max_elapsed"
        raise Retry(Verdict(Outcome.RETRY, ambiguous=True, reason=reason))
    return next_step


def looked_up(core: IntentCore, run: Run, response: httpx.Response) -> httpx.Response | None:
    """Take in a look-up made before a resend: the provider's record settles the intent
    (returned, or raised as a refusal); anything else is journaled and asked again."""
    lookup, verification = core.profile.lookup, run.verification
    assert lookup is not None
    assert verification is not None
    verdict = classify_lookup(response, lookup)
    now = core.clock()
    lookup_ended(core, run.record, verdict.kind, response, before_resend=True)
    if verdict.kind is not LookupKind.FOUND:
        _journal(
            core,
            run,
            _JOURNALED.get(verdict.kind, ReconcileOutcome.ERROR),
            verdict.detail,
            response,
        )
        verification.answered(verdict.kind, now, _backoff(core, verification))
        return None
    assert verdict.record is not None
    succeeded = verdict.state is IntentState.SUCCEEDED
    run.record = record = core.journal.reconciled(
        run.key,
        transition=Transition.VERIFIED_SUCCEEDED if succeeded else Transition.VERIFIED_FAILED,
        owner=run.owner,
        now=now,
        outcome=ReconcileOutcome.FOUND,
        detail=verdict.detail,
        status_code=response.status_code,
        response=from_lookup(verdict.record, response.status_code),
    )
    run.verification = None
    logger.info(
        "intent %s settled from the provider's record: %s",
        run.key,
        verdict.detail,
        extra=log_extra(record),
    )
    core.settled(record, provider_replayed=True)
    answer = replayed(record)
    assert answer is not None
    tagged(answer, record, replayed=False, provider_replayed=True)
    return core.deliver(record, answer)


def lookup_failed(core: IntentCore, run: Run, error: Exception) -> None:
    """A look-up that got no answer: journaled, and asked again later."""
    verification = run.verification
    assert verification is not None
    lookup_ended(core, run.record, None, None, before_resend=True)
    _journal(
        core, run, ReconcileOutcome.ERROR, f"status look-up failed: {type(error).__name__}", None
    )
    verification.answered(LookupKind.RETRY, core.clock(), _backoff(core, verification))


def _journal(
    core: IntentCore,
    run: Run,
    outcome: ReconcileOutcome,
    detail: str,
    response: httpx.Response | None,
) -> None:
    core.journal.looked_up(
        run.key,
        owner=run.owner,
        now=core.clock(),
        outcome=outcome,
        detail=detail,
        status_code=None if response is None else response.status_code,
    )


def _backoff(core: IntentCore, verification: Verification) -> float:
    # The retry policy's backoff, but not so fast that a short one floods the provider with
    # look-ups while the earlier attempt may still run.
    floor = core.profile.max_processing / 10
    return max(core.retry.backoff(verification.asked + 1), floor)
