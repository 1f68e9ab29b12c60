"""Watching intents: subclass ``Hooks`` (also ``payonce.Hooks``), override what you need,
and pass it as ``Client(hooks=...)``. Each method gets one of the frozen events here; none
carries an API key, a body or a header value. ``payonce.otel`` is OpenTelemetry's."""

from ._runtime._events import (
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
from ._runtime._hooks import Hooks

__all__ = [
    "AttemptEnded",
    "AttemptStarted",
    "Hooks",
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
]
