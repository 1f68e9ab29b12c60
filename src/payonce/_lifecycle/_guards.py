"""When each transition applies: its guard, a function of what the drive knows then.

The drive never picks a transition by itself. At each of its decision points it describes
the moment (a ``Moment``) and asks ``choose``: of the transitions that may follow there
(the point's candidates), the one whose guard holds. Guards are functions, so the table
can be run: ``tests/test_lifecycle.py`` walks every moment of each point and checks that
exactly one guard holds, and docs/contract.md names each transition's guard.

Transitions no decision point chooses are applied as the commands they are: the
write-ahead by a claim of a new intent, an attempt's start before it is sent, an operator's
abandon and a caller's acknowledgement.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ._states import RULES, IntentState, Transition
from ._verdicts import LookupKind, Outcome

__all__ = [
    "ATTEMPT_ENDED",
    "ATTEMPTS_OVER",
    "DECISION_POINTS",
    "GUARDS",
    "RECONCILED",
    "RESUMED",
    "UNLOOKED",
    "VERIFIED",
    "Moment",
    "choose",
    "contract_table",
]


@attrs.frozen
class Moment:
    """What the drive knows at a decision point; each guard reads a part of it."""

    outcome: Outcome | None = None
    """The verdict on an attempt's answer or error; None: it raised something that is not
    a transport failure (a bug, an interrupt, a cancellation)."""
    ambiguous: bool = False
    """The provider may have executed the request (this attempt's, or any attempt's)."""
    resend_refused: bool = False
    """A resend under the key is no longer safe (the key window, a clock gone back)."""
    lookup: LookupKind | None = None
    """The verdict on a status look-up; None: the look-up got no answer."""
    found: IntentState | None = None
    """The state of the provider's record a look-up found."""
    still_running: bool = False
    """An earlier attempt may still be executing at the provider."""
    per_call_key: bool = False
    """The intent was sent outside any block under a key drawn for its one call, and no
    operator asked for a resend: only that call may resend it (``key_per_call``)."""


Guard = Callable[[Moment], bool]


def answered_2xx(moment: Moment) -> bool:
    """A 2xx answer in the provider's own words."""
    return moment.outcome is Outcome.SUCCEEDED


def refused_definitively(moment: Moment) -> bool:
    """A definitive refusal in the provider's own words (a non-retryable 3xx or 4xx, a
    do-not-retry hint, the provider's word that the key holds another request)."""
    return moment.outcome in (Outcome.FAILED, Outcome.MISMATCH)


def retryable_may_have_executed(moment: Moment) -> bool:
    """A retryable end that may have executed: a timeout, a dropped connection, a 5xx, an
    in-flight 409, an answer that is not the provider's or cannot be decoded."""
    return moment.outcome is Outcome.RETRY and moment.ambiguous


def retryable_never_executed(moment: Moment) -> bool:
    """A retryable end that provably never executed: no connection, a 429."""
    return moment.outcome is Outcome.RETRY and not moment.ambiguous


def refused_before_execution(moment: Moment) -> bool:
    """A 401 or 403 in the provider's own words: credentials or permission."""
    return moment.outcome is Outcome.REFUSED and not moment.ambiguous


def refused_not_by_the_provider(moment: Moment) -> bool:
    """A 401 or 403 that is not the provider's answer (a firewall's page)."""
    return moment.outcome is Outcome.REFUSED and moment.ambiguous


def never_left(moment: Moment) -> bool:
    """The HTTP stack refused to send the request at all."""
    return moment.outcome is Outcome.NOT_SENT


def raised_otherwise(moment: Moment) -> bool:
    """The attempt raised something that is not a transport failure."""
    return moment.outcome is None


def may_have_executed(moment: Moment) -> bool:
    """At least one attempt may have reached the provider."""
    return moment.ambiguous


def none_executed(moment: Moment) -> bool:
    """No attempt reached the provider."""
    return not moment.ambiguous


def key_window_passed(moment: Moment) -> bool:
    """An attempt may have executed and a resend is no longer safe under the key."""
    return moment.resend_refused and not moment.per_call_key


def resend_safe(moment: Moment) -> bool:
    """A resend under the key cannot execute twice, and the key is not one drawn per call."""
    return not moment.resend_refused and not moment.per_call_key


def key_drawn_per_call(moment: Moment) -> bool:
    """Sent outside any block under a key drawn for its one call: the code run again may
    have paid under another key, so it is not resent on payonce's own."""
    return moment.per_call_key


def found_succeeded(moment: Moment) -> bool:
    """The provider has one record, in a succeeded status."""
    return moment.lookup is LookupKind.FOUND and moment.found is IntentState.SUCCEEDED


def found_failed(moment: Moment) -> bool:
    """The provider has one record, in a failed status."""
    return moment.lookup is LookupKind.FOUND and moment.found is IntentState.FAILED


def found_nothing_final(moment: Moment) -> bool:
    """The look-up settles nothing: no record, one not final, several, an unreadable or a
    refused answer, or none."""
    return moment.lookup is not LookupKind.FOUND


def absent_and_resendable(moment: Moment) -> bool:
    """No record, no earlier attempt still able to run, the key still valid, and not a
    key drawn per call."""
    return (
        moment.lookup is LookupKind.ABSENT
        and not moment.still_running
        and not moment.resend_refused
        and not moment.per_call_key
    )


def settles_nothing(moment: Moment) -> bool:
    """Anything else: stays unknown, with the reason."""
    return moment.lookup is not LookupKind.FOUND and not absent_and_resendable(moment)


T = Transition

GUARDS: dict[Transition, Guard] = {
    T.SUCCEEDED: answered_2xx,
    T.FAILED: refused_definitively,
    T.ATTEMPT_AMBIGUOUS: retryable_may_have_executed,
    T.ATTEMPT_NOT_EXECUTED: retryable_never_executed,
    T.ATTEMPT_REFUSED: refused_before_execution,
    T.ATTEMPT_REFUSED_UNPROVEN: refused_not_by_the_provider,
    T.ATTEMPT_NOT_SENT: never_left,
    T.ATTEMPT_INTERRUPTED: raised_otherwise,
    T.EXHAUSTED: may_have_executed,
    T.EXHAUSTED_UNSENT: none_executed,
    T.KEY_WINDOW_PASSED: key_window_passed,
    T.PER_CALL_KEY: key_drawn_per_call,
    T.ATTEMPT_STARTED: resend_safe,
    T.VERIFIED_SUCCEEDED: found_succeeded,
    T.VERIFIED_FAILED: found_failed,
    T.LOOKED_UP: found_nothing_final,
    T.RECONCILED_SUCCEEDED: found_succeeded,
    T.RECONCILED_FAILED: found_failed,
    T.RECONCILED_ABSENT: absent_and_resendable,
    T.RECONCILED_AMBIGUOUS: settles_nothing,
    T.RECONCILED_BY_RESEND: resend_safe,
    T.RECONCILED_KEY_WINDOW_PASSED: key_window_passed,
    T.RECONCILED_PER_CALL_KEY: key_drawn_per_call,
}
"""Each chosen transition's guard. The others (write-ahead, abandon, acknowledge) are
commands, applied when given."""

ATTEMPT_ENDED = (
    T.SUCCEEDED,
    T.FAILED,
    T.ATTEMPT_AMBIGUOUS,
    T.ATTEMPT_NOT_EXECUTED,
    T.ATTEMPT_REFUSED,
    T.ATTEMPT_REFUSED_UNPROVEN,
    T.ATTEMPT_NOT_SENT,
    T.ATTEMPT_INTERRUPTED,
)
"""An attempt answered or raised."""
ATTEMPTS_OVER = (T.EXHAUSTED, T.EXHAUSTED_UNSENT)
"""The retry policy allows no further attempt."""
RESUMED = (T.PER_CALL_KEY, T.KEY_WINDOW_PASSED, T.ATTEMPT_STARTED)
"""A pending intent journaled earlier is picked up again."""
VERIFIED = (T.VERIFIED_SUCCEEDED, T.VERIFIED_FAILED, T.LOOKED_UP)
"""A look-up before a resend answered (or got no answer)."""
RECONCILED = (
    T.RECONCILED_SUCCEEDED,
    T.RECONCILED_FAILED,
    T.RECONCILED_ABSENT,
    T.RECONCILED_AMBIGUOUS,
)
"""A reconciliation's look-up concluded (or its attempts ran out)."""
UNLOOKED = (T.RECONCILED_BY_RESEND, T.RECONCILED_KEY_WINDOW_PASSED, T.RECONCILED_PER_CALL_KEY)
"""An unknown intent of a profile without a status look-up is met (reconcile, the worker,
a call again): resent under its key while the key is surely still remembered."""

DECISION_POINTS = {
    "attempt ended": ATTEMPT_ENDED,
    "attempts over": ATTEMPTS_OVER,
    "resumed": RESUMED,
    "verified": VERIFIED,
    "reconciled": RECONCILED,
    "reconciled without a look-up": UNLOOKED,
}


def choose(point: tuple[Transition, ...], moment: Moment) -> Transition:
    """The transition of ``point`` whose guard holds at ``moment``."""
    for transition in point:
        if GUARDS[transition](moment):
            return transition
    raise AssertionError(f"no transition of {point} applies to {moment}")


def contract_table() -> str:
    """The transition table as docs/contract.md shows it (Markdown): each transition, where
    it may start and lead, the guard that chooses it, and when that is, in words."""
    lines = [
        "| transition | from | to | guard | when |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rule in RULES:
        sources = ", ".join("(new)" if s is None else f"`{s.value}`" for s in rule.sources)
        to = f"`{rule.to.value}`" if rule.to is not None else "unchanged"
        guard = GUARDS.get(rule.transition)
        chosen = f"`{guard.__name__}`" if guard is not None else "(a command)"
        lines.append(f"| {rule.transition.value} | {sources} | {to} | {chosen} | {rule.when} |")
    return "\n".join(lines)
