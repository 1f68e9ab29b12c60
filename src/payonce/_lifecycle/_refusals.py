"""The errors about one intent, worded once: what happened, to which intent, what to do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import httpx

from ..errors import (
    AuthenticationError,
    IntentError,
    IntentInFlight,
    IntentMismatch,
    IntentStateError,
    OutcomeUnknown,
    ProviderError,
    ProviderUnavailable,
)
from ._identity import request_differences, step_key, step_of_reference
from ._records import IntentDraft, IntentRecord, IntentRequest
from ._states import IntentState
from ._verdicts import Outcome, Verdict

__all__ = [
    "abandoned",
    "answer_not_kept",
    "authentication",
    "block_ended_before_later_steps",
    "in_flight",
    "lookup_refused",
    "mismatch",
    "of_step",
    "of_step_row",
    "per_call_key",
    "refused",
    "unavailable",
    "unknown",
    "went_on_after",
]

E = TypeVar("E", bound=IntentError)


def _about(error: type[E], record: IntentRecord, what: str, **details: Any) -> E:
    """``error`` about ``record``: "intent KEY (reference 'REF') " then ``what``."""
    message = f"{_subject(record.key, record.reference)} {what}"
    return error(message, key=record.key, reference=record.reference, **details)


def _subject(key: str | None, reference: str | None) -> str:
    return f"intent {key}" + (f" (reference {reference!r})" if reference else "")


def _step_subject(draft: IntentDraft) -> str:
    """How an error names step n >= 2 of a block: its position, its intent (by reference,
    else by key) and its own key, the one to resume or reconcile."""
    intent = repr(draft.intent_reference) if draft.intent_reference else draft.intent_key
    return f"step {draft.step} of intent {intent} (key {draft.key})"


def of_step(error: E, draft: IntentDraft) -> E:
    """``error``, raised by the drive of step n >= 2 of a block (whose journaled record
    has no reference of its own), made to name the step, its intent's reference and its
    key, in its words and its attributes."""
    error.reference = draft.intent_reference
    error.step = draft.step
    error.intent_key = draft.intent_key
    message = str(error)
    step_subject = _step_subject(draft)
    if message.startswith(step_subject):
        return error  # worded for the step already (a changed step)
    plain = f"{_subject(draft.key, None)} "
    own = f"{_subject(draft.key, draft.reference)} "  # its record, by its step reference
    if draft.reference is not None and message.startswith(own):
        error.args = (f"{step_subject} {message[len(own) :]}", *error.args[1:])
    elif message.startswith(plain) and not message.startswith(f"{plain}(reference "):
        # Its record journaled by earlier code, without a step reference.
        error.args = (f"{step_subject} {message[len(plain) :]}", *error.args[1:])
    else:
        # About another intent's record (a key the caller set that is another intent's):
        # its own words stay, after the step's name.
        error.args = (f"{step_subject}: {message}", *error.args[1:])
    return error


def of_step_row(error: E, record: IntentRecord, *, max_length: int) -> E:
    """``error``, raised by ``resume`` or ``reconcile`` about a journaled step n >= 2 of a
    block, which they drive without its block, made to name it as the block would: "step
    n of intent 'order-1' (key KEY-stepN) …", with ``step`` n and its intent's reference
    (and key, where the step's key is derived from it), read from the step's reference
    (``order-1#stepN``), where its key is one payonce derives for a step n (``…-stepN``).
    Any other record's error is left as it is: an intent an earlier payonce journaled
    under a reference of the caller's in that form (``legacy-9#step2``, keyed as any
    intent), or a step under a key the caller set, cannot be told from the other by the
    row, and naming an intent "step 2 of intent 'legacy-9'" would be false. ``max_length``:
    the provider's key limit, which step keys are derived to fit."""
    found = step_of_reference(record.reference)
    if found is None or error.key != record.key:
        return error
    name, number = found
    if not record.key.endswith(f"-step{number}"):
        return error  # not a key payonce derives for a step n: nothing ties it to a block
    # The block's name is its reference, or its intent's key when it had none: a step
    # keyed from the name itself was named by its intent's key.
    named_by_key = step_key(name, number, max_length=max_length) == record.key
    intent_key = name if named_by_key else _intent_key_of(record.key, number, max_length)
    request = {field.name: getattr(record, field.name) for field in attrs.fields(IntentRequest)}
    draft = IntentDraft(
        **request,
        key_supplied=True,
        step=number,
        intent_key=intent_key,
        intent_reference=None if named_by_key else name,
    )
    return of_step(error, draft)


def _intent_key_of(key: str, number: int, max_length: int) -> str | None:
    """The key of the intent whose step ``number`` is keyed ``key``, where that can be read
    off it (``KEY-step2``); None for a key the caller set, or a hashed one."""
    head = key.removesuffix(f"-step{number}")
    return head if head != key and step_key(head, number, max_length=max_length) == key else None


def in_flight(record: IntentRecord) -> IntentInFlight:
    return _about(
        IntentInFlight,
        record,
        f"is being sent by another worker ({record.lease_owner}); wait for it, or call "
        "again to get its stored outcome",
    )


def unknown(
    record: IntentRecord,
    *,
    reconcilable: bool,
    key_gone: bool = False,
    automatic_window: float | None = None,
    operator_may_resend: bool = False,
) -> OutcomeUnknown:
    """``key_gone``: a resend under its key is no longer safe (the key may be gone at the
    provider); with no status look-up to ask, only a person can settle it.
    ``automatic_window`` as in ``unknown_remedy``; ``operator_may_resend``: only the
    assumed lifetime's short window refused it, so ``payonce reconcile KEY --resend``
    still can."""
    reason = record.unknown_reason or "outcome unknown"
    remedy = unknown_remedy(
        record.key,
        reconcilable=reconcilable,
        key_gone=key_gone,
        step=step_of_reference(record.reference) is not None,
        automatic_window=automatic_window,
    )
    if reconcilable:
        what = f"has an unknown outcome ({reason}); it will not be resent blindly. {remedy}"
    elif key_gone:
        what = f"has an unknown outcome ({reason}); payonce no longer resends it. {remedy}"
        if operator_may_resend:
            what += (
                f". If you know the provider still keeps its key, `payonce reconcile "
                f"{record.key} --resend` resends it under that key (within 90% of the "
                "assumed lifetime)"
            )
    else:
        # Resent under its key while it is surely remembered: not "never resent".
        what = f"has an unknown outcome ({reason}). {remedy}"
    return _about(OutcomeUnknown, record, what, reason=reason)


def unknown_remedy(
    key: str,
    *,
    reconcilable: bool,
    key_gone: bool = False,
    step: bool = False,
    automatic_window: float | None = None,
) -> str:
    """What to do about an unknown intent: ask the provider; or, when its profile has no
    status look-up to ask with, resend it under its key while the provider surely still
    remembers the key, and past that look at the provider by hand. ``step``: the intent
    is step n >= 2 of a block, which a new reference would run again from its step 1.
    ``automatic_window``: the seconds after its first send within which payonce resends
    it on its own (a profile whose key lifetime is assumed, not documented), said at once
    so that nobody learns of the limit only once it has passed."""
    if reconcilable:
        return f"Reconcile it: payonce reconcile {key}"
    if step:
        # A new reference would run the block again from its step 1: pay that twice.
        never = (
            "never run the block again under a new reference, which would run its step 1 "
            "a second time: if it did not execute, finish the order outside the block, by hand"
        )
    else:
        never = "do not pay again under a new reference before you know"
    by_hand = (
        "check at the provider whether it executed, then close the intent with "
        f"`payonce abandon {key} --reason ...`; {never}"
    )
    if key_gone:
        # Past the key window: the in-window way (a call again, reconcile) no longer works.
        return f"This provider profile has no status look-up, so payonce cannot ask: {by_hand}"
    while_remembered = "while the provider surely still remembers its key"
    if automatic_window is not None:
        while_remembered = (
            f"within {automatic_window / 60:g} minutes of its first send (this provider's "
            "key lifetime is assumed, not documented; after that only when you ask, with "
            f"`payonce reconcile {key} --resend`, while the key is surely remembered)"
        )
    return (
        "This provider profile has no status look-up, so payonce cannot ask; instead, "
        f"{while_remembered}, calling again with the same reference, "
        f"`payonce reconcile {key}` or `payonce worker` resends it under its key (the "
        "provider replays what it executed, or executes it once). Once the key may be gone, "
        f"{by_hand}"
    )


def per_call_key(key: str, *, looked_up: str | None = None) -> str:
    """Why an intent journaled outside any block under a key drawn for its one call is not
    resent by a resume, a worker or a reconciliation, and what to do (the reason it stays
    unknown with). ``looked_up``: what a status look-up found, when one was made."""
    found = f"{looked_up}; " if looked_up else ""
    return (
        f"{found}it was sent outside any intent block under a key drawn for that one call "
        "(the SDK's own, payonce's for a request that carried none, or one the caller "
        "passed, which payonce cannot tell from a uuid4), and the code that made it may "
        "have run again since under another key and paid, so payonce does not resend it. "
        "Check at the provider whether it executed (a status look-up finds it "
        f"where the provider profile can: `payonce reconcile {key}`); if it did, or the "
        f"order was paid under another key, `payonce abandon {key} --reason ...`; only if "
        f"you are sure it was never paid, `payonce reconcile {key} --resend` sends it under "
        "its key. Put the call in a block (`with client.intent(order_id):`) so that a run "
        "again finds it"
    )


def abandoned(record: IntentRecord) -> IntentStateError:
    why = f"was abandoned by an operator ({record.abandon_reason}); it is never resent"
    if step_of_reference(record.reference) is not None:
        # A new reference would run the block from its step 1: a second payment.
        what = (
            f"{why}. The block cannot carry on past an abandoned step, and a new reference "
            "would run it again from its step 1 (pay that a second time): finish this order "
            "outside the block, by hand"
        )
        return _about(IntentStateError, record, what)
    return _about(IntentStateError, record, f"{why}. Use a new reference to pay again")


def answer_not_kept(record: IntentRecord, why: str) -> IntentStateError:
    """A settled intent replayed whose answer's body was too large to journal, and that
    the provider could not give again: nothing was sent twice, and nothing empty is handed
    back as if it were the answer."""
    assert record.response is not None
    status = record.response.status
    what = (
        f"{record.state.value} (HTTP {status}), but its answer's body was larger than "
        "max_stored_response_bytes and was not journaled, and it could not be got again "
        f"without executing anything twice: {why}. Nothing was sent twice, and no empty "
        "body is handed back as its answer. The operation itself is done: read its result "
        f"at the provider (`payonce intents show {record.key}` shows what was sent), and "
        "raise max_stored_response_bytes so that answers this large are kept"
    )
    return _about(IntentStateError, record, what)


def unavailable(record: IntentRecord, reason: str) -> ProviderUnavailable:
    return _about(
        ProviderUnavailable,
        record,
        f"was never executed by the provider ({reason}); it stays pending under its key: "
        "calling again later is safe",
    )


def mismatch(
    draft: IntentDraft,
    record: IntentRecord,
    *,
    reconcilable: bool,
    enqueuing: bool = False,
    declined: bool = False,
) -> IntentMismatch:
    """``enqueuing``: the refusal of ``enqueue(connection=...)``, which writes rather than
    sends, and leaves the caller's transaction as it was before the call. ``declined``:
    ``record`` succeeded with an answer whose body declines the payment (Adyen's 200
    ``Refused``)."""
    if _another_blocks_step_under_this_key(draft, record):
        return _key_of_another_blocks_step(draft, record, enqueuing=enqueuing)
    if draft.step > 1 and record.key == draft.key:
        return _step_mismatch(draft, record, reconcilable, declined=declined)
    if draft.step > 1 and draft.reference is not None and record.reference == draft.reference:
        return _step_key_changed(draft, record, reconcilable)
    if draft.key_supplied and record.key == draft.key and record.reference != draft.reference:
        return _key_set_for_another_request(draft, record, enqueuing=enqueuing)
    if draft.key_supplied and record.key != draft.key:
        what = f"reference {draft.reference!r} is bound to key {record.key}, not {draft.key}"
    elif record.scope != draft.scope:
        what = f"key {record.key} belongs to {record.scope!r}, not {draft.scope!r}"
    else:
        what = "the request differs from the one first journaled for it"
        if differences := request_differences(record, draft):
            what += f" in {', '.join(differences)}"
    if enqueuing:
        refused = "cannot be enqueued again for another request"
        nothing = (
            "Nothing was written by this call, and your transaction is as it was before it: "
            "if you commit it, this reference's payment is that intent, with its first request"
        )
    else:
        refused, nothing = "cannot be sent", "Nothing was sent"
    return _about(
        IntentMismatch,
        record,
        f"{refused}: {what} (stored fingerprint {record.fingerprint[:16]}…, new "
        f"{draft.fingerprint[:16]}…). {nothing}. {_what_now(record, reconcilable)}",
        stored_fingerprint=record.fingerprint,
        new_fingerprint=draft.fingerprint,
    )


def _key_set_for_another_request(
    draft: IntentDraft, record: IntentRecord, *, enqueuing: bool
) -> IntentMismatch:
    """The key the caller's code set for this request was first used, under another
    reference (or none), for a different request: the key is that request's, and a new
    reference would meet it again. Another key is the way on."""
    differences = request_differences(record, draft)
    differing = f" in {', '.join(differences)}" if differences else ""
    first = f"intent {record.reference!r}" if record.reference else "a call with no reference"
    this = f"intent {draft.reference!r}" if draft.reference else "this call"
    action = "enqueued" if enqueuing else "sent"
    return IntentMismatch(
        f"idempotency key {record.key}, set by your code for {this}, was first used by "
        f"{first} ({record.method} {record.url}, {record.state.value}) for a request that "
        f"differs from this one{differing} (stored fingerprint {record.fingerprint[:16]}…, "
        f"new {draft.fingerprint[:16]}…). Nothing was {action} and the journal is unchanged. "
        "A key names one request: give this one another idempotency key (a new reference "
        "alone would meet the same key again); the same request under this key gets that "
        "intent's answer",
        key=record.key,
        reference=draft.reference,
        stored_fingerprint=record.fingerprint,
        new_fingerprint=draft.fingerprint,
    )


def _another_blocks_step_under_this_key(draft: IntentDraft, record: IntentRecord) -> bool:
    """Whether the key this request asks for (one the caller set) holds step n >= 2 of
    another block: the row is journaled under a step reference that is not this
    request's position, and not of this very intent (a block run once by its key, once by
    its reference, names its steps both ways)."""
    stepped = step_of_reference(record.reference)
    if stepped is None or record.key != draft.key or record.reference == draft.reference:
        return False
    if draft.step == 1:
        return True
    return stepped[0] not in (draft.intent_reference, draft.intent_key)


def _key_of_another_blocks_step(
    draft: IntentDraft, record: IntentRecord, *, enqueuing: bool
) -> IntentMismatch:
    """The caller's key for this request is the key of step n of another block (most
    often the very one payonce derived for it, ``KEY-stepN``): that row is the other
    block's, whatever this request is, and choosing another key is the way on."""
    stepped = step_of_reference(record.reference)
    assert stepped is not None
    intent, number = stepped
    if draft.step > 1:
        subject = _step_subject(draft)
        reference = draft.intent_reference
    else:
        subject = _subject(draft.key, draft.reference)
        reference = draft.reference
    whose = (
        "the one payonce derived for"
        if record.key.endswith(f"-step{number}")
        else "the key its code set on"
    )
    if enqueuing:
        refused, nothing = "cannot be enqueued", "Nothing was written by this call"
    else:
        refused, nothing = "cannot be sent", "Nothing was sent"
    return IntentMismatch(
        f"{subject}, {draft.method} {urlsplit(draft.url).path}, {refused}: its idempotency "
        f"key {record.key} is {whose} step {number} of intent {intent!r} (journaled there "
        f"as {record.method} {urlsplit(record.url).path}, {record.state.value}), not a key "
        f"of this intent's. {nothing} and the journal is unchanged. Choose another key for "
        "this intent, one of its own (derived from its order, never another intent's key "
        f"followed by -stepN). Step {number} of intent {intent!r} stays that block's",
        key=record.key,
        reference=reference,
        stored_fingerprint=record.fingerprint,
        new_fingerprint=draft.fingerprint,
    )


def _step_mismatch(
    draft: IntentDraft, record: IntentRecord, reconcilable: bool, *, declined: bool = False
) -> IntentMismatch:
    """Step n of an intent asked for with another request than the one journaled there
    (its method and path's occurrence, ``_steps.place``): the code that runs in the block
    changed between runs."""
    journaled = f"{record.method} {urlsplit(record.url).path}"
    now = f"{draft.method} {urlsplit(draft.url).path}"
    if journaled != now:
        what = f"it was journaled as {journaled} and is now {now}"
    else:
        what = "its request differs from the one journaled"
        if differences := request_differences(record, draft):
            what += f" in {', '.join(differences)}"
    return IntentMismatch(
        f"{_step_subject(draft)}, {now}, cannot be sent: {what}. "
        "Nothing was sent and the journal is unchanged. A block's k-th request to an "
        "endpoint is its k-th step journaled there, on every run: restore the code that "
        f"journaled them (`payonce intents show {draft.intent_key}` shows them). This step "
        f"{_declined_what_now() if declined else _step_what_now(record, reconcilable)}",
        key=record.key,
        reference=draft.intent_reference,
        stored_fingerprint=record.fingerprint,
        new_fingerprint=draft.fingerprint,
    )


def _step_key_changed(
    draft: IntentDraft, record: IntentRecord, reconcilable: bool
) -> IntentMismatch:
    """Step n of an intent asked for under another key than the one its position was
    first journaled under (its step reference binds the two): most often a key the
    caller's code draws per call, a uuid4, which would make every run again a new payment."""

    def whose(key: str) -> str:
        return "payonce's key for it" if key == draft.derived_key else "a key your code set"

    if draft.key == draft.derived_key and record.key.endswith(f"-step{draft.step}"):
        return _another_blocks_step(draft, record, reconcilable)
    if draft.key == draft.derived_key:
        now = f"this run leaves the key to payonce ({draft.key})"
    else:
        now = f"this run's code sets {draft.key}"
    return IntentMismatch(
        f"{_step_subject(draft)}, {draft.method} "
        f"{urlsplit(draft.url).path}, cannot be sent: it was journaled under key "
        f"{record.key} ({whose(record.key)}), and {now}. Nothing was sent and the journal "
        "is unchanged. A step's key must be the same on every run, or a run again would "
        "pay that step again: a key drawn per call (uuid4) changes every run. Derive it "
        'from the order (e.g. f"order-{id}-tip"), or let payonce key the step (leave '
        'idempotency_key out, or sdk_keys="replace" where the integration takes it). '
        f"This step {_step_what_now(record, reconcilable)}",
        key=record.key,
        reference=draft.intent_reference,
        stored_fingerprint=record.fingerprint,
        new_fingerprint=draft.fingerprint,
    )


def _another_blocks_step(
    draft: IntentDraft, record: IntentRecord, reconcilable: bool
) -> IntentMismatch:
    """Step n's reference holds a row under a key payonce derived for another block's
    step n: two blocks named alike (``intent("order-9")`` and ``intent(key="order-9")``,
    or one reference on two endpoints) share their steps' references, never their keys."""
    return IntentMismatch(
        f"{_step_subject(draft)}, {draft.method} {urlsplit(draft.url).path}, cannot be "
        f"sent: its reference {record.reference!r} holds step {draft.step} of another "
        f"block named alike (key {record.key}, not this block's {draft.derived_key}): two "
        "intents named the same (a reference and a key, or one reference whose first "
        "requests went to different endpoints) share their steps' references, and this "
        "block cannot journal a step 2 or later under that name. Nothing was sent and the "
        f"journal is unchanged. This block's step 1 is journaled (`payonce intents show "
        f"{draft.intent_key}`): renamed, the block would run it again (a second payment), "
        "so finish this order by hand, and name orders so that no reference is another "
        f"intent's key or is used on two endpoints. The other block's step {draft.step} "
        f"is {record.state.value}: it stays that block's",
        key=record.key,
        reference=draft.intent_reference,
        stored_fingerprint=record.fingerprint,
        new_fingerprint=draft.fingerprint,
    )


def _declined_what_now() -> str:
    """``_step_what_now`` for a step whose 2xx answer declines the payment in its body."""
    return (
        "was answered with a 2xx whose body declines the payment (e.g. Adyen's resultCode "
        "Refused): journaled as succeeded, it is replayed as it was and is no refused step "
        "a later run may pass over with another request. Make the block try the other card "
        "after this one (this step replays its decline, the other card becomes the next "
        "step), or pay it in a block of its own"
    )


def _step_what_now(record: IntentRecord, reconcilable: bool) -> str:
    """``_what_now`` for step n >= 2 ("This step …"): once the step is settled, a new
    reference is no way on (it would run the block again from its step 1, paying that a
    second time)."""
    if record.state in (IntentState.SUCCEEDED, IntentState.FAILED, IntentState.ABANDONED):
        ended = {
            IntentState.SUCCEEDED: "succeeded: its operation is done",
            IntentState.FAILED: "failed: the provider refused it",
            IntentState.ABANDONED: "was abandoned by an operator",
        }[record.state]
        return (
            f"{ended}, and the request first journaled for it gets its stored outcome. Do "
            "not use a new reference for the block: it would run again from its step 1 "
            "(a second payment)"
        )
    return _what_now(record, reconcilable).removeprefix("That intent ")


def _what_now(record: IntentRecord, reconcilable: bool) -> str:
    """What to do about a mismatch, by the state of the intent already journaled: "a new
    reference" pays twice when its first request may have executed."""
    twice = (
        "so a new reference could pay twice: do not pay this operation again under a new "
        "reference before it is settled"
    )
    match record.state:
        case IntentState.PENDING if record.attempt_count == 0:
            return (
                "That intent is enqueued and has not been sent yet: the next resume sends it "
                "with the request first journaled. To pay with the new request instead, "
                f"first abandon it (`payonce abandon {record.key} --reason ...`, once the "
                "transaction that enqueued it has committed), then use a new reference for "
                "the new request: the reference stays bound to its first request, even "
                "abandoned. A new reference without abandoning it would pay twice once both "
                "are sent"
            )
        case IntentState.PENDING:
            return (
                f"That intent is pending: its first request may have reached the provider, "
                f"{twice}. To finish it, call again with the request first journaled, or run "
                "`payonce resume`"
            )
        case IntentState.UNKNOWN:
            if not reconcilable:
                step = step_of_reference(record.reference) is not None
                remedy = unknown_remedy(record.key, reconcilable=False, step=step)
                return (
                    f"That intent is unknown: the provider may have executed it, {twice}. {remedy}"
                )
            return (
                f"That intent is unknown: the provider may have executed it, {twice}. "
                f"Reconcile it first (`payonce reconcile {record.key}`): if the provider has no "
                "record of it, it is pending again and `payonce resume` sends it under its key"
            )
        case IntentState.SUCCEEDED:
            return (
                "That intent succeeded: its operation is done, and the request first journaled "
                "gets its stored answer. Use a new reference for a new operation"
            )
        case IntentState.FAILED:
            return (
                "That intent failed: the provider refused it. Use a new reference for a new "
                "operation"
            )
        case IntentState.ABANDONED:
            return (
                "That intent was abandoned by an operator, and the reference stays bound to "
                "it: use a new reference for the new request"
            )


def refused(record: IntentRecord, response: httpx.Response, verdict: Verdict) -> IntentError:
    """The error of a failed intent's stored refusal, by the verdict on it: the profile's,
    not the bare status (Stripe's mismatch is a 400 that only its body tells apart)."""
    status = response.status_code
    if verdict.outcome is Outcome.MISMATCH:
        return _about(
            IntentMismatch,
            record,
            f"was refused by the provider: it holds this key for a different request (HTTP "
            f"{status}). Use a new reference for a new operation; if your code sets this "
            "idempotency key itself, give the new request another key too (under a new "
            "reference the same key would be refused again)",
            stored_fingerprint="(provider)",
            new_fingerprint=record.fingerprint,
        )
    what = (
        f"was refused by the provider with HTTP {status}; the refusal is journaled and will "
        "be replayed for this intent. "
    )
    if step_of_reference(record.reference) is not None:
        # A new reference would run the block again from its step 1 (a second payment);
        # another request at this position, in this run or a later one, is a step of its own.
        what += (
            "To try a different request (another card), make it in the block: in this run, "
            "or when the block runs again, where it passes this refused step over and "
            "becomes the next one"
        )
    else:
        what += "Use a new reference to try a different request"
    return _about(ProviderError, record, what, response=response)


_LATER_STATE = {
    IntentState.SUCCEEDED: "succeeded",
    IntentState.FAILED: "was refused too",
    IntentState.PENDING: "is pending: it may have executed (no run has its answer yet)",
    IntentState.UNKNOWN: "is unknown: the provider may have executed it",
    IntentState.ABANDONED: "was abandoned by an operator",
}


def _later_steps_said(later: Sequence[tuple[int, str, str]]) -> str:
    """'step 3 (key K-step3) succeeded; step 4 …', from (position, key, state)."""
    return "; ".join(
        f"step {number} (key {key}) {_LATER_STATE.get(IntentState(state), state)}"
        for number, key, state in later
    )


_OTHER_REQUEST_ADVICE = "To try a different request (another card)"


def went_on_after(refusal: ProviderError, later: Sequence[tuple[int, IntentRecord]]) -> None:
    """``refusal``, a step's refusal replayed, told of the steps its block journaled after
    it (``later``: position and record): a run went on past it with another request, so
    it is no outcome of the intent on its own. Flagged in its words and ``later_steps``."""
    refusal.later_steps = tuple((number, r.key, r.state.value) for number, r in later)
    message = str(refusal)
    head, _, _ = message.partition(_OTHER_REQUEST_ADVICE)
    refusal.args = (
        f"{head.rstrip()} But a run went on past this refusal with another request: "
        f"{_later_steps_said(refusal.later_steps)}. This refusal is not the intent's "
        "outcome, and the order may be paid: do not act on it alone. Unless this block "
        "goes on to that request, it raises IntentMismatch as it ends",
        *refusal.args[1:],
    )


def block_ended_before_later_steps(
    draft: IntentDraft, position: int, refusal: ProviderError
) -> IntentMismatch:
    """The error a block raises as it ends when its last step was a refusal replayed
    (``refusal``, of the step at ``position``, asked with ``draft``) while a run had gone
    on past it: it never asked for the steps journaled after it (``later_steps``), whose
    outcome is the intent's."""
    later = refusal.later_steps
    last_number, last_key, _ = later[-1]
    intent = repr(draft.intent_reference) if draft.intent_reference else draft.intent_key
    name = draft.intent_reference or draft.intent_key
    request = f"{draft.method} {urlsplit(draft.url).path}"
    error = IntentMismatch(
        f"step {position} of intent {intent} (key {refusal.key}), {request}, was refused "
        f"by the provider (HTTP {refusal.status_code}) in an earlier run, and a run went on "
        f"past it with another request: {_later_steps_said(later)}. This run asked for "
        f"step {position}'s refused request again and the block ended there, so the refusal "
        "is not the intent's outcome: the order may be paid. Nothing was sent and the "
        "journal is unchanged. Do not act on the refusal (never pay the order again under "
        "a new reference): run the block with the request that went on, which gets step "
        f"{last_number}'s outcome (resent under its key where it may not have executed), "
        f"or look at the intent with `payonce intents show {name}` and settle it with "
        f"`payonce reconcile {name}`",
        key=last_key,
        reference=draft.intent_reference,
        stored_fingerprint=f"(step {last_number}: another request)",
        new_fingerprint=draft.fingerprint,
    )
    error.step = last_number
    error.intent_key = draft.intent_key
    return error


def authentication(
    record: IntentRecord, response: httpx.Response, *, foreign: bool = False
) -> AuthenticationError:
    if foreign:
        what = (
            f"was refused with HTTP {response.status_code} by something that is not the "
            "provider (its answer is not the provider's: a firewall, a proxy): the request may "
            "have reached the provider. The intent stays pending under its key: fix what "
            "blocks it, then call again (or `payonce resume`); payonce resends it only while "
            "the provider still remembers the key"
        )
        return _about(AuthenticationError, record, what, response=response, may_have_executed=True)
    what = (
        f"was refused by the provider with HTTP {response.status_code} before it executed "
        "it: the API key is wrong, revoked or lacks a permission. Nothing was executed and "
        "the intent stays pending under its key: fix the key, then call again (or `payonce "
        "resume`)"
    )
    return _about(AuthenticationError, record, what, response=response)


def lookup_refused(record: IntentRecord, response: httpx.Response) -> ProviderError:
    what = (
        f"could not be looked up: the provider refused the status look-up with HTTP "
        f"{response.status_code}; it stays unknown"
    )
    return _about(ProviderError, record, what, response=response)
