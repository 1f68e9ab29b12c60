"""One typed interface for watching intents: subclass ``Hooks``, override what you need.

A hook watches; it never steers. Whatever one raises is logged and dropped, so a broken
exporter can never leave an intent half-journaled or turn a payment into a retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._lifecycle import IntentState
from ..errors import ConfigurationError
from ._events import (
    AttemptEnded,
    AttemptStarted,
    IntentEnded,
    IntentEscalated,
    IntentEvent,
    IntentReconciled,
    IntentReplayed,
    IntentResumed,
    IntentSettled,
    IntentStarted,
    IntentUnknown,
    JournalCommitted,
    LookupEnded,
    RetryEvent,
    WorkerPassEnded,
)

__all__ = ["HookSet", "Hooks"]

logger = logging.getLogger("payonce")

E = TypeVar("E")


class Hooks:
    """Called as intents move. Every method does nothing here: override the ones you need.

    Events are frozen records without secrets or bodies. ``AsyncClient`` runs journal steps
    in a worker thread, and some events are raised there: keep hooks quick and
    thread-safe. An exception from a hook is logged (logger ``payonce``) and ignored.

    For one drive of an intent the order is: ``intent_started``, then per attempt
    ``attempt_started`` and ``attempt_ended`` (with ``retrying`` between attempts and
    ``lookup_ended`` for each look-up before a resend), then ``settled`` or ``unknown``
    when it came to that, and always ``intent_ended`` last.
    """

    def intent_started(self, event: IntentStarted) -> None:
        """A drive of an intent begins (a new one, or a pending one picked up again)."""

    def attempt_started(self, event: AttemptStarted) -> None:
        """An attempt is journaled and about to be sent."""

    def attempt_ended(self, event: AttemptEnded) -> None:
        """An attempt ended: answered, timed out, failed, or interrupted."""

    def retrying(self, event: RetryEvent) -> None:
        """payonce waits ``event.wait`` seconds before the next attempt."""

    def lookup_ended(self, event: LookupEnded) -> None:
        """A status look-up (before a resend, or by ``reconcile``) ended."""

    def settled(self, event: IntentSettled) -> None:
        """The intent reached its final answer during a drive."""

    def replayed(self, event: IntentReplayed) -> None:
        """A call on a settled intent was answered from the journal."""

    def unknown(self, event: IntentUnknown) -> None:
        """The intent's outcome cannot be learnt by retrying: reconcile it."""

    def intent_ended(self, event: IntentEnded) -> None:
        """A drive of an intent is over, whatever ended it."""

    def resumed(self, event: IntentResumed) -> None:
        """One intent of a ``resume`` pass is done with."""

    def reconciled(self, event: IntentReconciled) -> None:
        """One intent of a ``reconcile`` pass is done with."""

    def journal_committed(self, event: JournalCommitted) -> None:
        """The client's journal committed a transaction (any client's, on a shared one)."""

    def escalated(self, event: IntentEscalated) -> None:
        """``payonce worker`` gave up reconciling an unknown intent: a person must look."""

    def worker_pass(self, event: WorkerPassEnded) -> None:
        """A pass of ``payonce worker`` is over, with its counts."""


def _log_extra(event: object) -> dict[str, Any] | None:
    """The intent fields of a log record about ``event``, as every other record has them."""
    if not isinstance(event, IntentEvent):
        return None
    if isinstance(event, IntentReconciled):
        state = event.after.value
    elif isinstance(event, IntentUnknown | IntentEscalated):
        state = IntentState.UNKNOWN.value
    else:  # events of a drive name no state: the intent is pending while it is driven
        found = getattr(event, "state", IntentState.PENDING)
        state = found.value if isinstance(found, IntentState) else str(found)
    return {"key": event.key, "reference": event.reference, "state": state}


class _OnRetry(Hooks):
    """``on_retry=``: the one-callable shorthand for ``Hooks.retrying``."""

    def __init__(self, on_retry: Callable[[RetryEvent], None]) -> None:
        self._on_retry = on_retry

    def retrying(self, event: RetryEvent) -> None:
        self._on_retry(event)


class HookSet:
    """The client's hooks, called in order, each isolated from the rest and from payonce.

    False when empty: callers test it before building an event, so a client without hooks
    pays nothing for them.
    """

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self._hooks = tuple(hooks)

    @classmethod
    def of(
        cls, hooks: Hooks | Sequence[Hooks] | None, on_retry: Callable[[RetryEvent], None] | None
    ) -> HookSet:
        if hooks is None:
            given: list[object] = []
        elif isinstance(hooks, list | tuple):
            given = list(hooks)
        else:
            given = [hooks]
        for hook in given:
            if not isinstance(hook, Hooks):
                raise ConfigurationError(
                    f"hooks must be payonce.Hooks instances (subclass it and override what "
                    f"you need), not {hook!r}"
                )
        if on_retry is not None:
            if not callable(on_retry):
                raise ConfigurationError(f"on_retry must be callable, not {on_retry!r}")
            given.append(_OnRetry(on_retry))
        return cls([hook for hook in given if isinstance(hook, Hooks)])

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def wants(self, method: Callable[[Hooks, E], None]) -> bool:
        """Whether any hook overrides ``method``: what costs to watch is watched only then."""
        return any(getattr(type(hook), method.__name__) is not method for hook in self._hooks)

    def emit(self, method: Callable[[Hooks, E], None], event: E) -> None:
        """Call ``method`` (``Hooks.settled``…) of every hook with ``event``."""
        name = method.__name__
        for hook in self._hooks:
            try:
                getattr(hook, name)(event)
            except Exception:
                logger.warning(
                    "hook %s.%s raised; ignored, the intent goes on",
                    type(hook).__name__,
                    name,
                    exc_info=True,
                    extra=_log_extra(event),
                )
