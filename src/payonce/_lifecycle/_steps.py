"""Where a request goes in its block: the placement of steps, and the declined-step rule.

A block's steps are matched to what its earlier runs journaled by **what they are, not
when they come** (``place``): the k-th request of a run with a given method and path is
the k-th step journaled with that method and path (its occurrence), whatever came before
it. Its body (and the headers that count) must then be the journaled one, or it is a
changed step, refused before anything is sent (``IntentMismatch``). A method and path the
block never journaled is the next free position. Positions stay the journal's numbering in
order of first journaling, so step keys (``KEY-step2``) and references (``order-7#step2``)
do not move. Conditional code then completes once: a skipped customer create leaves the
payment to meet its own journaled step, "confirm unless already confirmed" sends nothing,
reordered steps each meet their own. What no journal can tell: code that sends an
operation to another endpoint between runs is another operation.

One exception lets a customer try again after a refusal: a card declined, the process
ended, and the customer came back with another card. The journaled step (confirm with card
A) was refused by the provider in its own words; it executed nothing the provider would
ever replay as a success. A request of the same method and path that differs from it
(confirm with card B) **passes it over**: it is matched with the next occurrence instead,
and where there is none it becomes the next free position, under that position's own key
and reference. A deterministic re-run of the first run (A, declined; then B) still lands
on the same positions: A matches its step, B the one after.

Nothing else is passed over: a step that succeeded, is pending, unknown or abandoned may
have executed, so a different request at its occurrence is changed code or a second
payment, and stays refused. See ``may_pass_over`` for the exact rule.

A run that asks for the refused request again (card A alone: the first job redelivered)
replays the refusal, yet the intent did not end there: a run went on after it and may
have paid. The refusal is replayed with the block's steps journaled after it
(``later_positions``, ``is_this_blocks_step``), so that it never reads as the intent's
outcome alone: the block raises ``IntentMismatch`` as it ends, unless it goes on to them.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Iterator, Sequence

import attrs
import httpx

from ._identity import scope_path, step_key, step_of_reference, step_reference
from ._records import IntentDraft, IntentRecord
from ._states import IntentState
from ._verdicts import AnswerRules, Outcome, classify_response

# -- placing a request in its block -----------------------------------------------------


@attrs.frozen
class JournaledStep:
    """A step an earlier run of the block journaled, as placement reads it."""

    position: int
    method: str
    path: str
    fingerprint: str
    """The request's one fingerprint (``CanonicalRequest.fingerprint_with``)."""
    key: str
    state: IntentState
    declined: bool = False
    """The provider refused it in its own words, so a different request of its method
    and path may pass it over (``may_pass_over``'s rule, decided by ``journaled_steps``)."""


@attrs.frozen
class PlacedStep:
    """A request this run of the block has placed already, and what came of it."""

    position: int
    method: str
    path: str
    fingerprint: str
    state: IntentState | None
    """As this run last saw it; None: never journaled."""
    caller_key: str | None = None
    """A key the caller's code set on it, on purpose."""
    answered: bool = False
    """Its success was handed back to the caller in this run."""


@attrs.frozen
class AskedStep:
    """The request a block is asked for now."""

    method: str
    path: str
    fingerprint: str
    caller_key: str | None = None


@attrs.frozen
class Replay:
    """The request is the step journaled (or placed) at ``position``, settled: replayed."""

    position: int


@attrs.frozen
class Continue:
    """The request is the step at ``position``, not settled (pending, unknown, abandoned,
    or placed in this run and not answered): driven on under its key, never anew."""

    position: int


@attrs.frozen
class NewStep:
    """A request the block never journaled: the next free ``position``."""

    position: int


class RefusalKind(enum.Enum):
    CHANGED = "changed"
    """Its occurrence is journaled as another request: a changed step (``IntentMismatch``)."""
    REPEATED = "repeated"
    """The same request as a step that succeeded in this run, while another has not: a
    retry of the whole operation inside the block, or a second payment? (refused)"""


@attrs.frozen
class Refuse:
    """Nothing may be sent: ``position`` holds ``journaled``, which ``asked`` is not."""

    kind: RefusalKind
    position: int
    journaled: JournaledStep | PlacedStep
    asked: AskedStep
    unfinished: PlacedStep | None = None
    """For ``REPEATED``: the step of this run that has not succeeded."""


Placement = Replay | Continue | NewStep | Refuse

_SETTLED = (IntentState.SUCCEEDED, IntentState.FAILED)


def place(
    journaled: Sequence[JournaledStep], placed: Sequence[PlacedStep], asked: AskedStep
) -> Placement:
    """Where ``asked`` goes in its block, given the steps earlier runs ``journaled`` and
    those this run ``placed`` already. No I/O; the block binds the answer to records.

    1. A key the caller set names its step: a step of this run under it, else a journaled
       step under it (refused if it holds another request). Otherwise, below (the claim
       then holds the position to its key).
    2. The same request as a step of this run whose success was not handed back (pending,
       unknown, refused, or raised before its answer came) is that step again: the
       caller's retry, or an SDK's.
    3. The same request as a step of this run that succeeded and was answered is a second
       request on purpose (two identical charges): it takes the next occurrence. Unless a
       step of this run has not succeeded: then it looks like a retry loop running the
       operation again inside the block (``REPEATED``, refused).
    4. Its occurrence: the first journaled step of its method and path that no request of
       this run holds. The same request there: replayed, or continued. Another request:
       passed over when the provider declined it (``JournaledStep.declined``; never under
       a key the caller set), else refused (``CHANGED``).
    5. None left: the next free position, after every journaled and placed one.
    """
    if asked.caller_key is not None:
        for step in placed:
            if step.caller_key == asked.caller_key:
                return _at(step.position, step.state)
        for found in journaled:
            if found.key == asked.caller_key:
                if found.fingerprint != asked.fingerprint or not _same_endpoint(found, asked):
                    return Refuse(RefusalKind.CHANGED, found.position, found, asked)
                return _at(found.position, found.state)
    repeated: PlacedStep | None = None
    for step in placed:
        if step.caller_key is None and asked.caller_key is None and _same(step, asked):
            if not step.answered:
                return _at(step.position, step.state)
            repeated = repeated or step
    if repeated is not None:
        unfinished = next((step for step in placed if not step.answered), None)
        if unfinished is not None:
            return Refuse(RefusalKind.REPEATED, repeated.position, repeated, asked, unfinished)
    taken = {step.position for step in placed}
    for found in sorted(journaled, key=lambda step: step.position):
        if found.position in taken or not _same_endpoint(found, asked):
            continue
        if found.fingerprint == asked.fingerprint:
            return _at(found.position, found.state)
        if found.declined and asked.caller_key is None:
            continue  # passed over: the next occurrence, or a new position
        return Refuse(RefusalKind.CHANGED, found.position, found, asked)
    return NewStep(max(taken | {step.position for step in journaled}, default=0) + 1)


def _same_endpoint(step: JournaledStep | PlacedStep, asked: AskedStep) -> bool:
    return step.method == asked.method and step.path == asked.path


def _same(step: JournaledStep | PlacedStep, asked: AskedStep) -> bool:
    return _same_endpoint(step, asked) and step.fingerprint == asked.fingerprint


def _at(position: int, state: IntentState | None) -> Replay | Continue:
    return Replay(position) if state in _SETTLED else Continue(position)


def journaled_steps(
    records: Iterable[IntentRecord],
    *,
    intent_key: str,
    intent: str,
    rules: AnswerRules,
    max_length: int,
) -> list[JournaledStep]:
    """The steps a block journaled, read off its rows: step 1 (the row under
    ``intent_key``) and the rows whose reference is a step of ``intent`` (the block's
    reference, else its key: ``order-7#step2``). Rows of another block named alike (under
    a reference of that form but not this block's derived key, nor a key a caller set)
    are still steps at their position: a request there is compared with them, never sent
    over them. A row is ``declined`` where ``may_pass_over``'s rule lets a request of its
    endpoint pass it over."""
    steps: list[JournaledStep] = []
    for record in records:
        if record.key == intent_key:
            position = 1
        elif (found := step_of_reference(record.reference)) is not None and found[0] == intent:
            position = found[1]
        else:
            continue
        declined = False
        if position >= 2:
            derived = step_key(intent_key, position, max_length=max_length)
            declined = (
                record.key == derived
                and record.reference in (None, step_reference(intent, position))
                and _declined(record, rules)
            )
        steps.append(
            JournaledStep(
                position=position,
                method=record.method,
                path=scope_path(record.scope, account=record.account, method=record.method),
                fingerprint=record.fingerprint,
                key=record.key,
                state=record.state,
                declined=declined,
            )
        )
    return sorted(steps, key=lambda step: step.position)


# -- the declined-step rule -------------------------------------------------------------

__all__ = [
    "AskedStep",
    "Continue",
    "JournaledStep",
    "NewStep",
    "PlacedStep",
    "Placement",
    "Refuse",
    "RefusalKind",
    "Replay",
    "is_this_blocks_step",
    "journaled_steps",
    "later_positions",
    "may_pass_over",
    "next_position",
    "place",
]


def may_pass_over(record: IntentRecord, draft: IntentDraft, rules: AnswerRules) -> bool:
    """Whether ``record``, journaled at the position ``draft`` asks for (a step 2 or
    later), may be passed over by ``draft``, a different request.

    All of these must hold, or the request stays refused as a changed step:

    - ``record`` is **this block's** step at this position: journaled under the key this
      block derives for it (``{block key}-step{n}``), with this position's step reference
      (or none, journaled before step references). Another block's row that shares the
      reference (another intent named ``order-9``), or a row under a key the caller set on
      the step, cannot be tied to this block: a payment written over it would be another
      block's step. A step whose key the caller sets never passes anything over;
    - the request differs from it (method, path, body or a header that counts): the same
      request under another key is a key that changed between runs, refused as such;
    - it **failed**, settled by the provider's own answer to this very request: a 4xx
      whose body was kept, which the profile reads today as a definitive refusal about
      the request itself (a declined card, a validation error). Not a failure a status
      look-up found (that is the provider's record, not its answer to the request), not
      the provider's word about the key (it holds another request, or one still running:
      the profile's mismatch or in-flight statuses, or any refusal whose body names
      idempotency), which says something executed under that key; not a 5xx (it may have
      run in part), not an answer whose body was not kept (what it said cannot be read
      again).
    """
    if draft.step < 2 or record.state is not IntentState.FAILED:
        return False
    if record.fingerprint == draft.fingerprint and record.scope == draft.scope:
        return False
    if not _this_blocks_position(record, draft):
        return False
    return _declined(record, rules)


def _declined(record: IntentRecord, rules: AnswerRules) -> bool:
    """Whether ``record`` failed by the provider's own refusal of its request (the
    answer part of ``may_pass_over``'s rule)."""
    if record.state is not IntentState.FAILED:
        return False
    answer = record.response
    if answer is None or not answer.body_stored or not 400 <= answer.status < 500:
        return False
    if answer.status in rules.mismatch_statuses or answer.status in rules.in_flight_statuses:
        return False
    if _names_idempotency(answer.body, key=record.key):
        # Whatever the profile makes of it: a refusal that talks about the key may be the
        # provider saying the key already holds another request (a journal restored from
        # an older copy, another block's row), which is no decline of this one.
        return False
    refusal = httpx.Response(
        answer.status,
        headers=list(answer.headers),
        content=answer.body,
        request=httpx.Request(record.method, record.url),
    )
    return classify_response(refusal, rules).outcome is Outcome.FAILED


_MOST_LEVELS = 64
"""How deep into a refusal's JSON its words are read: deeper than any provider's error."""
_MOST_VALUES = 20_000
"""How many of its values (objects, lists, strings...) are read at most."""


def _names_idempotency(body: bytes, *, key: str) -> bool:
    """Whether a refusal's own words name the idempotency key: any string of its JSON, at
    any depth (``{"error": {"type": "idempotency_error"}}``, ``{"errors": [{"code":
    "IDEMPOTENCY_KEY_REUSED"}]}``, a provider's error wrapped in a gateway's), or its
    text where it is no JSON. ``key``, the step's own key, is left out of the strings
    first: the declined payment a refusal carries may echo it (``"idempotency_key":
    key``), and a key may be any text. Field names are not words: that payment's ``idempotency_key``
    field says nothing about a refusal.

    A body nested deeper, or holding more values, than is read (``_MOST_LEVELS``,
    ``_MOST_VALUES``) counts as naming the key: what was not read could, and the safe
    side is a step not passed over."""
    try:
        data = json.loads(body)
    except RecursionError:
        return True  # nested deeper than the JSON decoder goes
    except ValueError:
        return _says_idempotency(body.decode("utf-8", errors="replace"), key)
    # Read without recursion, with a bound on depth and size: the body is the provider's.
    unread: list[tuple[object, int]] = [(data, 0)]
    read = 0
    while unread:
        value, level = unread.pop()
        read += 1
        if read > _MOST_VALUES or level > _MOST_LEVELS:
            return True
        if isinstance(value, str):
            if _says_idempotency(value, key):
                return True
        elif isinstance(value, dict):
            unread.extend((item, level + 1) for item in value.values())
        elif isinstance(value, list):
            unread.extend((item, level + 1) for item in value)
    return False


def _says_idempotency(words: str, key: str) -> bool:
    return "idempoten" in words.replace(key, "").lower()


def _this_blocks_position(record: IntentRecord, draft: IntentDraft) -> bool:
    """Whether ``record`` is the row this block journals at ``draft``'s position: its key
    is the one the block derives there and the draft is keyed by it (not a key the caller
    set), and its reference is that position's (or none, journaled before step
    references had one)."""
    if draft.derived_key is None or draft.key != draft.derived_key:
        return False
    if record.key != draft.derived_key:
        return False
    return record.reference is None or record.reference == draft.reference


def is_this_blocks_step(record: IntentRecord, draft: IntentDraft) -> bool:
    """Whether ``record`` is the row this block journals at ``draft``'s position (under
    the key payonce derives there, with that position's reference): not another block's
    row named alike, nor a step under a key the caller set."""
    return _this_blocks_position(record, draft)


def later_positions(draft: IntentDraft, *, max_length: int) -> Iterator[IntentDraft]:
    """The positions after ``draft``'s (a step 2 or later), one after another, without
    end: where a run that went on past ``draft``'s step journaled its next requests."""
    while True:
        draft = next_position(draft, max_length=max_length)
        yield draft


def next_position(draft: IntentDraft, *, max_length: int) -> IntentDraft:
    """``draft`` moved to the position after its own: that position's derived key (a key
    the caller set stays the step's key) and step reference."""
    assert draft.step >= 2
    assert draft.intent_key is not None
    number = draft.step + 1
    derived = step_key(draft.intent_key, number, max_length=max_length)
    return attrs.evolve(
        draft,
        key=derived if draft.key == draft.derived_key else draft.key,
        reference=step_reference(draft.intent_reference or draft.intent_key, number),
        step=number,
        derived_key=derived,
    )
