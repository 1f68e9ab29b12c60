"""The frozen records payonce hands to ``Hooks``: what happened to which intent.

They carry names, numbers and states only: never an API key, a request or response body,
or a header value, so a hook may log or export them as they are.
"""

from __future__ import annotations

from typing import Any

import attrs

from .._journal._reports import JournalCommitted
from .._lifecycle import IntentRecord, IntentState, ReconcileOutcome

__all__ = [
    "AttemptEnded",
    "AttemptStarted",
    "IntentEnded",
    "IntentEscalated",
    "IntentEvent",
    "IntentReconciled",
    "IntentReplayed",
    "IntentResumed",
    "IntentSettled",
    "IntentStarted",
    "IntentUnknown",
    "JournalCommitted",
    "LookupEnded",
    "RetryEvent",
    "WorkerPassEnded",
    "about",
    "log_extra",
]


@attrs.frozen
class IntentEvent:
    """Which intent: every event names it so."""

    key: str
    reference: str | None
    provider: str
    account: str


def about(record: IntentRecord) -> dict[str, Any]:
    """The ``IntentEvent`` fields of ``record``, to build any event of it."""
    return {
        "key": record.key,
        "reference": record.reference,
        "provider": record.provider,
        "account": record.account,
    }


def log_extra(record: IntentRecord, state: IntentState | None = None) -> dict[str, Any]:
    """``extra=`` of a log record about ``record``: structured logging (a JSON formatter,
    structlog) gets the intent without parsing the message."""
    return {
        "key": record.key,
        "reference": record.reference,
        "state": (state or record.state).value,
    }


@attrs.frozen
class IntentStarted(IntentEvent):
    """A drive of the intent begins: its first attempt is about to be sent, or an intent
    journaled earlier and still pending is picked up again (``resumed``)."""

    resumed: bool


@attrs.frozen
class AttemptStarted(IntentEvent):
    """An attempt's request is built, journaled and about to leave."""

    attempt: int


@attrs.frozen
class AttemptEnded(IntentEvent):
    """An attempt ended; ``outcome`` is the journal transition it led to (for example
    ``"settled, succeeded"`` or ``"attempt ended, ambiguous"``)."""

    attempt: int
    outcome: str
    status_code: int | None
    error: str | None
    """The name of the exception the attempt ended with, if it ended with one."""


@attrs.frozen
class RetryEvent(IntentEvent):
    """Handed to ``on_retry`` and ``Hooks.retrying`` before payonce waits to retry."""

    attempt: int
    """The attempt that just failed (1-based)."""
    wait: float
    reason: str
    ambiguous: bool


@attrs.frozen
class LookupEnded(IntentEvent):
    """A status look-up at the provider was answered, or failed.

    ``before_resend`` is True for a look-up made during a drive (verify before resend),
    False for one made by ``reconcile``. ``outcome`` is ``found``, ``not_found``,
    ``cannot_tell`` (no record, from a look-up that cannot see this request: a Stripe
    confirm), ``still_unknown``, ``refused``, ``retry`` (asked again soon) or ``error`` (no
    answer, or one payonce cannot read).
    """

    outcome: str
    status_code: int | None
    before_resend: bool
    elapsed: float | None
    """Seconds from sending the look-up to its answer, when one came."""


@attrs.frozen
class IntentSettled(IntentEvent):
    """The intent reached a final answer during a drive, from the provider's answer to an
    attempt or (``provider_replayed``) from the provider's own record of it."""

    state: IntentState
    status_code: int | None
    attempts: int
    provider_replayed: bool


@attrs.frozen
class IntentReplayed(IntentEvent):
    """A call on a settled intent got its journaled answer; nothing was sent."""

    state: IntentState
    status_code: int | None


@attrs.frozen
class IntentUnknown(IntentEvent):
    """Whether the intent executed can no longer be learnt by retrying: it went unknown,
    and waits for ``reconcile``."""

    reason: str


@attrs.frozen
class IntentEnded(IntentEvent):
    """A drive of the intent is over (every ``IntentStarted`` has one), whatever ended it:
    ``state`` is where it left the intent (``pending`` when it will be sent again)."""

    state: IntentState
    attempts: int


@attrs.frozen
class IntentResumed(IntentEvent):
    """What one intent of a ``resume`` pass came to."""

    state: IntentState
    detail: str


@attrs.frozen
class IntentReconciled(IntentEvent):
    """What one intent of a ``reconcile`` pass came to."""

    before: IntentState
    after: IntentState
    outcome: ReconcileOutcome
    """``found``, ``not_found``, ``cannot_tell``, ``still_unknown``, ``error``, ``skipped``
    or ``resent`` (a ``str``)."""
    detail: str


@attrs.frozen
class IntentEscalated(IntentEvent):
    """The worker gave up reconciling an unknown intent: its provider profile's schedule
    (``ReconcileSchedule``) is spent, or the profile has no status look-up. The intent stays
    unknown; a person must check it at the provider, then ``payonce reconcile`` or
    ``payonce abandon`` it. Said once per worker process and intent."""

    tries: int
    """Look-ups made since the intent went unknown."""
    unknown_since: float
    """When it went unknown (epoch seconds), as the journal tells."""
    reason: str
    """Why it is still unknown: the last look-up's finding, or why none can be made."""


@attrs.frozen
class WorkerPassEnded:
    """One pass of ``payonce worker`` over its journal is over: what it did, in numbers."""

    sent: int
    """Pending intents of which it sent an attempt. One it only marked unknown (its key
    too old to resend, or drawn for one call) or found settled by a verifying look-up was
    driven, not sent."""
    settled: int
    """Intents it brought to ``succeeded`` or ``failed`` (sent or reconciled)."""
    unknown: int
    """Unknown intents left in the groups it drove, escalated ones included."""
    escalated: int
    """Unknown intents it escalated in this pass."""
    failed: int
    """Pending intents it could not send (still pending: the provider unreachable, a
    refused API key...), failed look-ups, and groups whose pass broke off (the journal
    unreachable)."""
    seconds: float
    """How long the pass took."""
    pending: int = 0
    """Pending intents left in the groups it was to drive (those it could not drive
    included): the provider unreachable, or no API key for their account."""
    not_driven: int = 0
    """Groups of intents (an account of a provider) it could not drive this pass: no API
    key, no base URL of their own, an unknown profile (said on an ERROR line)."""
    driven: int = 0
    """Groups of intents it drove this pass."""
    damaged: int = 0
    """Pending or unknown rows of its accounts and providers that no longer decode
    (``payonce.journal.DamagedRow``): skipped, never sent, each said on an ERROR line."""
