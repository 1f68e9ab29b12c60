"""A step the provider refused in an earlier run, redone differently in a later one.

A block's steps are compared with the journal by position: run again, the request at
position n must be the one journaled there, or it is refused (``IntentMismatch``). One
exception lets a customer try again after a refusal: a card declined, the process ended,
and the customer came back with another card. The journaled step n (confirm with card A)
was refused by the provider in its own words; it executed nothing the provider would ever
replay as a success. A run whose request at position n differs from it (confirm with card
B) **passes it over**: the request is compared with step n+1 instead, and where there is
none it becomes step n+1, under that position's own key and reference. A deterministic
re-run of the first run (A, declined; then B) still lands on the same positions: A
matches step n (its refusal replayed), B step n+1.

Nothing else is passed over: a step that succeeded, is pending, unknown or abandoned may
have executed, so a different request at its position is changed code or a second
payment, and stays refused. See ``may_pass_over`` for the exact rule.

A run that asks for the refused request again (card A alone: the first job redelivered)
replays the refusal, yet the intent did not end there: a run went on at step n+1 and may
have paid. The refusal is replayed with the block's steps journaled after it
(``later_positions``, ``is_this_blocks_step``), so that it never reads as the intent's
outcome alone: the block raises ``IntentMismatch`` as it ends, unless it goes on to them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import attrs
import httpx

from ._identity import step_key, step_reference
from ._records import IntentDraft, IntentRecord
from ._states import IntentState
from ._verdicts import AnswerRules, Outcome, classify_response

__all__ = ["is_this_blocks_step", "later_positions", "may_pass_over", "next_position"]


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
