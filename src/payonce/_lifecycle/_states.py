"""The states of an intent and every move between them, as one table.

The journal applies a named ``Transition``; it never decides one. Which transition an
event amounts to is decided by its guard (``_guards``), asked by the drive; this module
only says, for each transition, from which states it may start and where it leads.
``docs/contract.md`` shows the same table, with the guards, and a test keeps them equal.
"""

from __future__ import annotations

import enum

import attrs

__all__ = [
    "LOOKUP_UNRECORDED",
    "MAY_HAVE_EXECUTED",
    "NOTHING_CHANGED",
    "NOTHING_SENT",
    "RULES",
    "IntentState",
    "Rule",
    "Transition",
    "Unwritten",
    "rule",
    "target",
]


class IntentState(enum.StrEnum):
    """Where an intent stands. ``succeeded`` and ``failed`` are final and replayable."""

    PENDING = "pending"
    """Journaled; not yet answered definitively. Safe to send under its key."""
    SUCCEEDED = "succeeded"
    """The provider answered 2xx; the answer is stored and replayed."""
    FAILED = "failed"
    """The provider refused definitively (a non-retryable 4xx it wrote); stored and replayed."""
    UNKNOWN = "unknown"
    """The provider may or may not have executed it. Only reconciliation moves it."""
    ABANDONED = "abandoned"
    """Closed by an operator; kept, never resent."""

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({IntentState.SUCCEEDED, IntentState.FAILED, IntentState.ABANDONED})


class Transition(enum.Enum):
    """Every event that moves (or keeps) an intent, by the name the journal applies."""

    WRITE_AHEAD = "write-ahead"
    ATTEMPT_STARTED = "attempt started"
    ATTEMPT_AMBIGUOUS = "attempt ended, ambiguous"
    ATTEMPT_NOT_EXECUTED = "attempt ended, not executed"
    ATTEMPT_INTERRUPTED = "attempt interrupted"
    ATTEMPT_REFUSED = "attempt refused before execution"
    ATTEMPT_REFUSED_UNPROVEN = "attempt refused, not by the provider"
    ATTEMPT_NOT_SENT = "attempt not sent"
    SUCCEEDED = "settled, succeeded"
    FAILED = "settled, failed"
    LOOKED_UP = "looked up before a resend"
    VERIFIED_SUCCEEDED = "verified, found succeeded"
    VERIFIED_FAILED = "verified, found failed"
    EXHAUSTED = "exhausted, ambiguous"
    EXHAUSTED_UNSENT = "exhausted, never executed"
    KEY_WINDOW_PASSED = "key window passed"
    PER_CALL_KEY = "key drawn per call, not resent"
    RECONCILED_SUCCEEDED = "reconciled, found succeeded"
    RECONCILED_FAILED = "reconciled, found failed"
    RECONCILED_ABSENT = "reconciled, absent"
    RECONCILED_AMBIGUOUS = "reconciled, ambiguous"
    RECONCILED_BY_RESEND = "reconciled by resend"
    RECONCILED_KEY_WINDOW_PASSED = "reconciled, key window passed"
    RECONCILED_PER_CALL_KEY = "reconciled, key drawn per call"
    ABANDONED = "abandoned"
    ACKNOWLEDGED = "acknowledged"


@attrs.frozen
class Unwritten:
    """What a caller may conclude when a journal write could not be made: the words that end
    its ``JournalError``, and whether the provider may have executed the request by then."""

    words: str
    may_have_executed: bool = False
    retry_later: bool = True
    """A journal that was only busy frees itself: "Retry later" is said then."""
    about: str = ""
    """The intent the write was for ("intent KEY", "the intent of reference 'R'"), when it
    is known: a lock held past the busy timeout is then said to be that intent's row."""

    def for_intent(self, key: str) -> Unwritten:
        return attrs.evolve(self, about=f"intent {key}")

    def for_reference(self, reference: str) -> Unwritten:
        """A reference's intent, whose key is the one journaled first (not yet read)."""
        return attrs.evolve(self, about=f"the intent of reference {reference!r}")


NOTHING_SENT = Unwritten("nothing was sent")
MAY_HAVE_EXECUTED = Unwritten(
    "the request may already have reached the provider, so this is not a refusal: the "
    "intent stays pending under its key, and calling again with the same reference once "
    "the journal is free settles it without paying twice",
    may_have_executed=True,
    retry_later=False,
)
LOOKUP_UNRECORDED = Unwritten(
    "the status look-up's finding was not recorded (a look-up executes nothing): the intent "
    "is as it was; reconcile it again once the journal is free"
)
NOTHING_CHANGED = Unwritten("nothing was changed")


@attrs.frozen
class Rule:
    transition: Transition
    sources: tuple[IntentState | None, ...]
    """The states it may start from; None is an intent not journaled yet."""
    to: IntentState | None
    """Where it leads; None keeps the state it started from."""
    when: str
    """When it applies, in the words of the contract; the function that decides it is its
    guard (``payonce._lifecycle._guards``)."""
    releases_lease: bool = False
    """Whether the worker gives the intent's lease up with it."""
    attempt_ambiguous: bool | None = None
    """For the end of an attempt: whether the provider may have executed it."""
    unwritten: Unwritten = NOTHING_SENT
    """What the caller may conclude if it cannot be journaled: whether a request may have
    reached the provider by the time it is."""


_P, _U = IntentState.PENDING, IntentState.UNKNOWN
_SETTLED = (IntentState.SUCCEEDED, IntentState.FAILED)

RULES: tuple[Rule, ...] = (
    Rule(
        Transition.WRITE_AHEAD,
        (None,),
        _P,
        "the intent, its request, its key and the start of attempt 1 are committed (fsynced) "
        "before a byte is sent",
    ),
    Rule(
        Transition.ATTEMPT_STARTED,
        (_P,),
        None,
        "a later attempt's start is committed (fsynced) before it is sent, under the same key",
    ),
    Rule(
        Transition.ATTEMPT_AMBIGUOUS,
        (_P,),
        None,
        "the attempt ended in a retryable way that may have executed (timeout, dropped "
        "connection, 5xx, in-flight 409, an answer that is not the provider's or cannot be "
        "decoded): retried under the same key",
        attempt_ambiguous=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.ATTEMPT_NOT_EXECUTED,
        (_P,),
        None,
        "the attempt provably never executed (connection not established, 429): retried",
        attempt_ambiguous=False,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.ATTEMPT_INTERRUPTED,
        (_P,),
        None,
        "the call raised something that is not a transport failure, or was interrupted: "
        "journaled as ambiguous, lease released, the error goes through",
        releases_lease=True,
        attempt_ambiguous=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.ATTEMPT_REFUSED,
        (_P,),
        None,
        "refused before executing (401, 403: credentials or permission): not retried, "
        "lease released, AuthenticationError; sent under the same key once the key is fixed",
        releases_lease=True,
        attempt_ambiguous=False,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.ATTEMPT_REFUSED_UNPROVEN,
        (_P,),
        None,
        "a 401 or 403 that is not the provider's answer (a firewall's page): not retried, "
        "lease released, AuthenticationError; the attempt may have executed, so its key's "
        "age rules a resend",
        releases_lease=True,
        attempt_ambiguous=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.ATTEMPT_NOT_SENT,
        (_P,),
        None,
        "the HTTP stack refused to send it (an invalid URL, an unsupported scheme, a header "
        "it will not write): nothing left, lease released, the error goes through",
        releases_lease=True,
        attempt_ambiguous=False,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.SUCCEEDED,
        (_P,),
        IntentState.SUCCEEDED,
        "a 2xx answer, stored",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.FAILED,
        (_P,),
        IntentState.FAILED,
        "a definitive refusal in the provider's own words (non-retryable 3xx or 4xx, a "
        "do-not-retry hint), stored",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.LOOKED_UP,
        (_P,),
        None,
        "after an attempt that may have executed, the status look-up (verify before resend) "
        "found no final record: journaled; resent only once nothing is found after the "
        "earlier attempt can no longer be running",
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.VERIFIED_SUCCEEDED,
        (_P,),
        IntentState.SUCCEEDED,
        "verify before resend found the provider's record, succeeded: settled from it, "
        "nothing resent",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.VERIFIED_FAILED,
        (_P,),
        IntentState.FAILED,
        "verify before resend found the provider's record, failed: settled from it, nothing resent",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.EXHAUSTED,
        (_P,),
        _U,
        "attempts ran out and at least one may have reached the provider",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.EXHAUSTED_UNSENT,
        (_P,),
        None,
        "attempts ran out and none executed: stays pending, lease released (ProviderUnavailable)",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.KEY_WINDOW_PASSED,
        (_P,),
        _U,
        "an attempt may have executed, and the next (a resume's, a resend's, a call's own "
        "retry) could end past the key window (90% of the key lifetime; 15 minutes of an "
        "assumed one): never sent",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.PER_CALL_KEY,
        (_P,),
        _U,
        "picked up again by a resume or a worker, and sent through the transport outside "
        "any block, whatever key it carried (it may be drawn for its one call: an SDK's, or "
        "a caller's `uuid4()`): the code that made it may have run again under another key, "
        "so it is never resent on payonce's own",
        releases_lease=True,
        unwritten=MAY_HAVE_EXECUTED,
    ),
    Rule(
        Transition.RECONCILED_SUCCEEDED,
        (_U,),
        IntentState.SUCCEEDED,
        "the provider has one record, in a succeeded status",
        releases_lease=True,
        unwritten=LOOKUP_UNRECORDED,
    ),
    Rule(
        Transition.RECONCILED_FAILED,
        (_U,),
        IntentState.FAILED,
        "the provider has one record, in a failed status",
        releases_lease=True,
        unwritten=LOOKUP_UNRECORDED,
    ),
    Rule(
        Transition.RECONCILED_ABSENT,
        (_U,),
        _P,
        "the provider has no record and the key is still within 90% of its lifetime",
        releases_lease=True,
        unwritten=LOOKUP_UNRECORDED,
    ),
    Rule(
        Transition.RECONCILED_AMBIGUOUS,
        (_U,),
        None,
        "no record past the key window or of an intent under a key drawn per call, a record "
        "not final yet, several records, an unreadable or refused look-up: stays unknown "
        "with the reason",
        releases_lease=True,
        unwritten=LOOKUP_UNRECORDED,
    ),
    Rule(
        Transition.RECONCILED_BY_RESEND,
        (_U,),
        _P,
        "the profile has no status look-up and the key is still within 90% of its lifetime "
        "(the provider's clock): back to pending and resent under its key at once, as a "
        "retry is (the provider replays what it executed, or executes it once)",
        releases_lease=True,
        unwritten=NOTHING_CHANGED,
    ),
    Rule(
        Transition.RECONCILED_KEY_WINDOW_PASSED,
        (_U,),
        None,
        "the profile has no status look-up and the key may be gone at the provider: never "
        "resent, stays unknown for a person to check",
        releases_lease=True,
        unwritten=NOTHING_CHANGED,
    ),
    Rule(
        Transition.RECONCILED_PER_CALL_KEY,
        (_U,),
        None,
        "the profile has no status look-up and the intent was sent through the transport "
        "outside any block (its key taken as drawn per call): never resent on payonce's own, "
        "stays unknown for a person to check (`payonce reconcile KEY --resend` if sure)",
        releases_lease=True,
        unwritten=NOTHING_CHANGED,
    ),
    Rule(
        Transition.ABANDONED,
        (_P, _U),
        IntentState.ABANDONED,
        "an operator's decision, while no worker holds a live lease on it",
        releases_lease=True,
        unwritten=NOTHING_CHANGED,
    ),
    Rule(
        Transition.ACKNOWLEDGED,
        _SETTLED,
        None,
        "the caller has recorded the settled outcome (client-side outbox)",
        unwritten=NOTHING_CHANGED,
    ),
)

_BY_TRANSITION = {rule.transition: rule for rule in RULES}


def rule(transition: Transition) -> Rule:
    return _BY_TRANSITION[transition]


def target(transition: Transition, state: IntentState | None) -> IntentState | None:
    """Where ``transition`` takes an intent in ``state``; None when it may not start there."""
    rule = _BY_TRANSITION[transition]
    if state not in rule.sources:
        return None
    return rule.to if rule.to is not None else state
