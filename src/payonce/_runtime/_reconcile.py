"""Settling ``unknown`` intents by asking the provider, never by guessing.

Per intent: ask the profile's status endpoint (by key, or by the caller's reference), then
write the conclusion once, with the look-up journaled beside it:

- the provider has a record with a definitive status: store it, settle succeeded/failed;
- it has none and the key is still within its lifetime: back to ``pending`` (a resend under
  the same key cannot execute twice);
- it has none and the key may have expired: stays ``unknown`` with the reason; only an
  operator may close it (``abandon``);
- anything else (a record still processing, an unreadable answer): stays ``unknown``.
"""

from __future__ import annotations

import logging

import attrs
import httpx

from .._journal._records import IntentRecord, StoredResponse
from .._lifecycle import (
    IntentState,
    LookupKind,
    Outcome,
    ReconcileOutcome,
    Transition,
    Verdict,
    classify_lookup,
    classify_lookup_error,
    quiet_after,
    resend_refusal,
)
from .._owners import owner_ended
from ..errors import ConfigurationError, JournalError
from . import _refusals as refusals
from ._core import IntentCore
from ._events import IntentReconciled, LookupEnded, about, log_extra
from ._hooks import Hooks
from ._responses import elapsed, from_lookup
from ._retrying import Retry

__all__ = [
    "ReconcileResult",
    "begin",
    "conclude",
    "give_up",
    "looked_up",
    "lookup_request",
    "reported",
    "targets",
]

logger = logging.getLogger("payonce")


@attrs.frozen
class ReconcileResult:
    """What one reconciliation found and what it did."""

    key: str
    reference: str | None
    before: IntentState
    after: IntentState
    outcome: ReconcileOutcome
    """``found``, ``not_found``, ``still_unknown``, ``error`` or ``skipped`` (a ``str``)."""
    detail: str


def skipped(record: IntentRecord, detail: str) -> ReconcileResult:
    return ReconcileResult(
        record.key, record.reference, record.state, record.state, ReconcileOutcome.SKIPPED, detail
    )


def targets(core: IntentCore, key_or_reference: str | None) -> list[IntentRecord]:
    """The intents of this client's account to reconcile: one key/reference, or all unknown.

    ``--all`` takes only this client's provider: another provider's intents must be looked
    up at that provider, with its key lifetime. A named one is returned whatever its
    provider, and ``begin`` says why it is skipped.
    """
    if key_or_reference is None:
        records = list(reversed(core.journal.list_intents(states=[IntentState.UNKNOWN])))
        records = [r for r in records if r.provider == core.profile.name]
    else:
        records = core.journal.find(key_or_reference)
    return [r for r in records if r.account == core.account]


def skip_reason(core: IntentCore, record: IntentRecord) -> str | None:
    """Why this client does not look the intent up, or None when it does."""
    if record.state is not IntentState.UNKNOWN:
        return f"{record.state.value}: nothing to reconcile"
    if record.provider != core.profile.name:
        return (
            f"sent through provider profile {record.provider!r}: reconcile it with a client "
            "for that provider"
        )
    return None


def begin(core: IntentCore, record: IntentRecord, owner: str) -> IntentRecord | ReconcileResult:
    """Take the intent's lease for the look-up, or say why it is skipped."""
    reason = skip_reason(core, record)
    if reason is not None:
        return skipped(record, reason)
    claim = core.journal.claim_key(
        record.key, owner=owner, now=core.clock(), lease_seconds=core.lease_seconds, unknown=True
    )
    if claim is None or claim.record.lease_owner != owner:
        return skipped(record, "another worker holds it right now")
    return claim.record


def end(core: IntentCore, key: str, owner: str) -> None:
    """Give the look-up's lease back. When that cannot be written (a full disk), the lease
    stays with an owner that will never use it again: this process's next reconciliation
    of the intent may take it at once, and any other once it expires. So that failure is
    not the pass's news: the error that came first (recording the finding) is."""
    try:
        core.journal.release(key, owner=owner)
    except JournalError as exc:
        owner_ended(owner)
        # Said once: after a failure already on its way out, this one is its echo.
        level = logging.DEBUG if exc.__context__ is not None else logging.WARNING
        logger.log(level, "intent %s: the look-up's lease was not given back: %s", key, exc)
    except BaseException:
        owner_ended(owner)
        raise


def check_lookup(core: IntentCore, record: IntentRecord) -> None:
    """Refuse to look ``record`` up with a profile that has no status look-up."""
    if core.profile.lookup is None:
        raise ConfigurationError(
            f"provider profile {core.profile.name!r} has no status look-up, so intent "
            f"{record.key} cannot be reconciled automatically: check it at the provider, "
            "then `payonce abandon` it or give the profile a Lookup"
        )


def lookup_request(
    core: IntentCore, record: IntentRecord, client: httpx.Client | httpx.AsyncClient
) -> httpx.Request:
    check_lookup(core, record)
    lookup = core.profile.lookup
    assert lookup is not None
    value = record.key if lookup.by == "key" else record.reference
    if value is None:
        raise ConfigurationError(
            f"provider {core.profile.name!r} looks intents up by reference, and intent "
            f"{record.key} has none: check it at the provider by hand"
        )
    return client.build_request(
        "GET",
        core.base_url + lookup.path,
        params=lookup.params(value),
        headers=core.auth_headers(),
    )


_OUTCOMES = {
    LookupKind.ABSENT: ReconcileOutcome.NOT_FOUND,
    LookupKind.UNDECIDED: ReconcileOutcome.STILL_UNKNOWN,
    LookupKind.UNREADABLE: ReconcileOutcome.ERROR,
}


def looked_up(
    core: IntentCore,
    record: IntentRecord,
    kind: LookupKind | None,
    response: httpx.Response | None,
    *,
    before_resend: bool,
) -> None:
    """Tell the hooks of a look-up's answer (``kind`` None: it got none)."""
    outcome = ReconcileOutcome.ERROR if kind is None else _OUTCOMES.get(kind, kind.value)
    if core.hooks:
        event = LookupEnded(
            **about(record),
            outcome=outcome,
            status_code=None if response is None else response.status_code,
            before_resend=before_resend,
            elapsed=None if response is None else elapsed(response),
        )
        core.hooks.emit(Hooks.lookup_ended, event)


def reported(core: IntentCore, result: ReconcileResult) -> None:
    """Tell the hooks what one intent of a pass came to."""
    if core.hooks:
        event = IntentReconciled(
            key=result.key,
            reference=result.reference,
            provider=core.profile.name,
            account=core.account,
            before=result.before,
            after=result.after,
            outcome=result.outcome,
            detail=result.detail,
        )
        core.hooks.emit(Hooks.reconciled, event)


def transport_failure(core: IntentCore, record: IntentRecord, error: Exception) -> Retry:
    """A look-up is a GET: every transport failure is worth retrying."""
    looked_up(core, record, None, None, before_resend=False)
    verdict = classify_lookup_error(error)
    reason = verdict.detail if verdict is not None else type(error).__name__
    return Retry(Verdict(Outcome.RETRY, False, reason=reason))


def conclude(
    core: IntentCore, record: IntentRecord, owner: str, response: httpx.Response
) -> ReconcileResult:
    """Journal what the provider's answer means for the intent."""
    lookup = core.profile.lookup
    assert lookup is not None
    verdict = classify_lookup(response, lookup)
    status = response.status_code
    looked_up(core, record, verdict.kind, response, before_resend=False)
    match verdict.kind:
        case LookupKind.RETRY:
            raise Retry(Verdict(Outcome.RETRY, False, reason=verdict.detail))
        case LookupKind.ABSENT:
            return _not_found(core, record, owner, status)
        case LookupKind.REFUSED:
            _journal(
                core, record, owner, ReconcileOutcome.ERROR, verdict.detail, status, _AMBIGUOUS
            )
            raise refusals.lookup_refused(record, response)
        case LookupKind.FOUND:
            assert verdict.record is not None
            stored = from_lookup(verdict.record, status)
            transition = (
                Transition.RECONCILED_SUCCEEDED
                if verdict.state is IntentState.SUCCEEDED
                else Transition.RECONCILED_FAILED
            )
            return _journal(
                core,
                record,
                owner,
                ReconcileOutcome.FOUND,
                verdict.detail,
                status,
                transition,
                stored,
            )
        case LookupKind.UNDECIDED | LookupKind.UNREADABLE:
            outcome = _OUTCOMES[verdict.kind]
            return _journal(core, record, owner, outcome, verdict.detail, status, _AMBIGUOUS)


def _not_found(core: IntentCore, record: IntentRecord, owner: str, status: int) -> ReconcileResult:
    quiet = quiet_after(core.journal.attempts(record.key), core.profile.max_processing)
    if core.profile.verifies and quiet is not None and core.clock() < quiet:
        # A slow server may still be executing an earlier attempt: "no record" proves
        # nothing yet, and back to pending would let a resend run beside it (a provider
        # that guards such a duplicate, resend="same-key", answers it 409 instead).
        detail = (
            f"the provider has no record yet, but an earlier attempt may still be executing "
            f"there for {quiet - core.clock():.0f}s more: reconcile again after that"
        )
        still = ReconcileOutcome.STILL_UNKNOWN
        return _journal(core, record, owner, still, detail, status, _AMBIGUOUS)
    refusal = resend_refusal(record.first_sent_at, core.clock(), core.profile.key_lifetime)
    if refusal is None:
        detail = "the provider has no record and the key is still valid: safe to resend"
        absent = Transition.RECONCILED_ABSENT
        return _journal(core, record, owner, ReconcileOutcome.NOT_FOUND, detail, status, absent)
    detail = (
        "the provider has no record, but the key may have expired there: a resend could "
        "execute twice. Check by hand, then abandon it or pay again under a new reference"
    )
    return _journal(core, record, owner, ReconcileOutcome.NOT_FOUND, detail, status, _AMBIGUOUS)


def give_up(core: IntentCore, record: IntentRecord, owner: str, reason: str) -> ReconcileResult:
    detail = f"status look-up failed: {reason}"
    return _journal(core, record, owner, ReconcileOutcome.ERROR, detail, None, _AMBIGUOUS)


_AMBIGUOUS = Transition.RECONCILED_AMBIGUOUS


def _journal(
    core: IntentCore,
    record: IntentRecord,
    owner: str,
    outcome: ReconcileOutcome,
    detail: str,
    status_code: int | None,
    transition: Transition,
    response: StoredResponse | None = None,
) -> ReconcileResult:
    """Apply the look-up's transition, with the look-up journaled beside it."""
    after = core.journal.reconciled(
        record.key,
        transition=transition,
        owner=owner,
        now=core.clock(),
        outcome=outcome,
        detail=detail,
        status_code=status_code,
        response=response,
    ).state
    logger.info(
        "intent %s reconciled: %s (%s)",
        record.key,
        outcome,
        detail,
        extra=log_extra(record, after),
    )
    return ReconcileResult(record.key, record.reference, record.state, after, outcome, detail)
