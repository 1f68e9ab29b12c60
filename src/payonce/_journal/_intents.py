"""The intent row a transaction works on: read (locked or not), and checked against the
transition table before a named transition is applied to it.

Shared by the private store's writes (``_store``) and the operator's commands of the
public journal (``_reads``): neither decides where a transition leads, the lifecycle's
table does (``_lifecycle.target``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._lifecycle import IntentRecord, IntentState, Transition, target
from ..errors import IntentStateError
from . import _sql as sql
from ._engine import Tx
from ._rows import intent_from_row

__all__ = ["allowed", "reread", "select_intent"]


def select_intent(
    tx: Tx, where: str, params: Sequence[Any], *, lock: bool = False
) -> IntentRecord | None:
    suffix = tx.dialect.lock_rows if lock else ""
    row = tx.one(sql.SELECT_INTENT + where + suffix, params)
    return intent_from_row(row) if row else None


def reread(tx: Tx, key: str) -> IntentRecord:
    record = select_intent(tx, sql.BY_KEY, (key,))
    assert record is not None, "a row this transaction holds cannot vanish"
    return record


def allowed(
    record: IntentRecord,
    transition: Transition,
    refusal: str = "intent {key} is {state}: '{transition}' does not apply to it",
) -> IntentState:
    """Where ``transition`` takes the intent; ``IntentStateError`` (worded by ``refusal``,
    a format string) when the transition table does not let it start from there."""
    to = target(transition, record.state)
    if to is None:
        state, what = record.state.value, transition.value
        raise IntentStateError(
            refusal.format(key=record.key, state=state, transition=what),
            key=record.key,
            reference=record.reference,
        )
    return to
