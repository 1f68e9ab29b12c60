"""OpenTelemetry for payonce (``pip install 'payonce[otel]'``): spans and metrics from hooks.

    from payonce.otel import OpenTelemetryHooks
    client = payonce.Client(..., hooks=OpenTelemetryHooks())

Traces: a ``payonce.intent`` span per drive of an intent (a child of the caller's span),
with a ``payonce.attempt`` child per attempt and a ``payonce.lookup`` child per status
look-up; a replay from the journal is a ``payonce.intent`` span of its own, and so is each
intent of a ``reconcile`` pass (``payonce.reconciled``), its look-ups as children. The
intent's span is the current one while it is driven, so the spans of httpx's own
instrumentation (``opentelemetry-instrumentation-httpx``) nest under it. Attributes:
``payonce.key``, ``payonce.reference``, ``payonce.provider``, ``payonce.account``,
``payonce.state``, ``payonce.attempt``, ``payonce.replayed`` and
``http.response.status_code``.

Metrics (counters unless said): ``payonce.intents`` (intents reaching a state, by that
state: ``succeeded`` or ``failed`` when settled, ``unknown``, and ``pending`` when a drive
or a reconciliation leaves one to be sent again), ``payonce.attempts`` (by outcome),
``payonce.retries``,
``payonce.unknown_outcomes``, ``payonce.replays``, and the histogram
``payonce.journal.commit.duration`` (seconds, by ``payonce.durable``). ``payonce worker``
adds ``payonce.escalations`` (unknown intents it gave up reconciling: alert on it),
``payonce.worker.intents`` (each pass's counts, by ``payonce.outcome``: ``sent``,
``settled``, ``escalated``, ``failed``), the gauge ``payonce.worker.unknown`` (unknown
intents left after the last pass) and the histogram ``payonce.worker.pass.duration``
(seconds). Metric attributes are provider, account and state or outcome: never a key or
reference, whose every value would be a new time series.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

import attrs

try:
    from opentelemetry import context, metrics, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as missing:  # said in payonce's words, not as a bare ModuleNotFoundError
    raise ImportError(
        "payonce.otel needs OpenTelemetry's API: pip install 'payonce[otel]' (and the "
        "OpenTelemetry SDK and exporters you use)"
    ) from missing

from ._lifecycle import IntentState
from ._runtime._events import (
    AttemptEnded,
    AttemptStarted,
    IntentEnded,
    IntentEscalated,
    IntentEvent,
    IntentReconciled,
    IntentReplayed,
    IntentSettled,
    IntentStarted,
    IntentUnknown,
    JournalCommitted,
    LookupEnded,
    RetryEvent,
    WorkerPassEnded,
)
from ._runtime._hooks import Hooks
from ._version import __version__

__all__ = ["OpenTelemetryHooks"]


@attrs.define
class _Drive:
    span: Span
    token: contextvars.Token[Context]
    attempt: Span | None = None


def _identity(event: IntentEvent) -> dict[str, Any]:
    found = {
        "payonce.key": event.key,
        "payonce.provider": event.provider,
        "payonce.account": event.account,
    }
    if event.reference is not None:
        found["payonce.reference"] = event.reference
    return found


def _series(event: IntentEvent, **more: Any) -> dict[str, Any]:
    return {"payonce.provider": event.provider, "payonce.account": event.account, **more}


class OpenTelemetryHooks(Hooks):
    """payonce's hooks as OpenTelemetry spans and metrics.

    Args:
        tracer_provider: Where spans go; the global provider by default.
        meter_provider: Where metrics go; the global provider by default.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("payonce", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("payonce", __version__, meter_provider=meter_provider)
        self._intents = meter.create_counter(
            "payonce.intents", unit="{intent}", description="Drives of intents, by end state"
        )
        self._attempts = meter.create_counter(
            "payonce.attempts", unit="{attempt}", description="Attempts sent, by outcome"
        )
        self._retries = meter.create_counter(
            "payonce.retries", unit="{retry}", description="Waits before another attempt"
        )
        self._unknown = meter.create_counter(
            "payonce.unknown_outcomes",
            unit="{intent}",
            description="Intents whose outcome retrying could not learn: reconcile them",
        )
        self._replays = meter.create_counter(
            "payonce.replays", unit="{call}", description="Calls answered from the journal"
        )
        self._commits = meter.create_histogram(
            "payonce.journal.commit.duration",
            unit="s",
            description="Journal write transactions, from begin to commit",
        )
        self._escalations = meter.create_counter(
            "payonce.escalations",
            unit="{intent}",
            description="Unknown intents the worker gave up reconciling: a person must look",
        )
        self._worker_intents = meter.create_counter(
            "payonce.worker.intents",
            unit="{intent}",
            description="What the worker's passes did, by outcome",
        )
        self._worker_unknown = meter.create_gauge(
            "payonce.worker.unknown",
            unit="{intent}",
            description="Unknown intents left after the worker's last pass",
        )
        self._worker_passes = meter.create_histogram(
            "payonce.worker.pass.duration", unit="s", description="The worker's passes"
        )
        self._lock = threading.Lock()
        self._drives: dict[str, _Drive] = {}
        self._lookups: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
        """Look-ups of a reconcile pass, made before its intent's span: (start, end,
        attributes), to become that span's children once the pass tells its outcome."""

    # -- one drive ---------------------------------------------------------------------------

    def intent_started(self, event: IntentStarted) -> None:
        attributes = {**_identity(event), "payonce.state": "pending", "payonce.replayed": False}
        attributes["payonce.resumed"] = event.resumed
        span = self._tracer.start_span(
            "payonce.intent", kind=SpanKind.INTERNAL, attributes=attributes
        )
        # Current while the intent is driven: started and ended in the caller's own thread
        # or task, so the attach and detach meet in the same context.
        token = context.attach(trace.set_span_in_context(span))
        with self._lock:
            self._drives[event.key] = _Drive(span, token)

    def attempt_started(self, event: AttemptStarted) -> None:
        with self._lock:
            drive = self._drives.get(event.key)
        if drive is None:
            return
        drive.attempt = self._tracer.start_span(
            "payonce.attempt",
            context=trace.set_span_in_context(drive.span),
            kind=SpanKind.INTERNAL,
            attributes={**_identity(event), "payonce.attempt": event.attempt},
        )

    def attempt_ended(self, event: AttemptEnded) -> None:
        self._attempts.add(1, _series(event, **{"payonce.outcome": event.outcome}))
        with self._lock:
            drive = self._drives.get(event.key)
        if drive is None or drive.attempt is None:
            return
        span, drive.attempt = drive.attempt, None
        span.set_attribute("payonce.outcome", event.outcome)
        if event.status_code is not None:
            span.set_attribute("http.response.status_code", event.status_code)
        if event.error is not None:
            span.set_attribute("error.type", event.error)
            span.set_status(Status(StatusCode.ERROR, event.error))
        span.end()

    def retrying(self, event: RetryEvent) -> None:
        self._retries.add(1, _series(event))
        with self._lock:
            drive = self._drives.get(event.key)
        if drive is not None:
            drive.span.add_event(
                "payonce.retry",
                {"payonce.wait": event.wait, "payonce.reason": event.reason},
            )

    def lookup_ended(self, event: LookupEnded) -> None:
        now = time.time_ns()
        started = now - int((event.elapsed or 0.0) * 1e9)
        attributes = {
            **_identity(event),
            "payonce.outcome": event.outcome,
            "payonce.before_resend": event.before_resend,
        }
        if event.status_code is not None:
            attributes["http.response.status_code"] = event.status_code
        with self._lock:
            drive = self._drives.get(event.key)
            if drive is None:
                self._lookups.setdefault(event.key, []).append((started, now, attributes))
                return
        self._lookup_span(drive.span, started, now, attributes)

    def _lookup_span(
        self, parent: Span, started: int, ended: int, attributes: dict[str, Any]
    ) -> None:
        span = self._tracer.start_span(
            "payonce.lookup",
            context=trace.set_span_in_context(parent),
            attributes=attributes,
            start_time=started,
        )
        span.end(end_time=ended)

    def settled(self, event: IntentSettled) -> None:
        self._intents.add(1, _series(event, **{"payonce.state": event.state.value}))
        with self._lock:
            drive = self._drives.get(event.key)
        if drive is None:
            return
        drive.span.set_attribute("payonce.provider_replayed", event.provider_replayed)
        if event.status_code is not None:
            drive.span.set_attribute("http.response.status_code", event.status_code)

    def unknown(self, event: IntentUnknown) -> None:
        self._unknown.add(1, _series(event))
        self._intents.add(1, _series(event, **{"payonce.state": "unknown"}))
        with self._lock:
            drive = self._drives.get(event.key)
        if drive is not None:
            drive.span.add_event("payonce.unknown", {"payonce.reason": event.reason})
            drive.span.set_status(Status(StatusCode.ERROR, "outcome unknown: reconcile it"))

    def intent_ended(self, event: IntentEnded) -> None:
        if event.state is IntentState.PENDING:
            self._intents.add(1, _series(event, **{"payonce.state": "pending"}))
        with self._lock:
            drive = self._drives.pop(event.key, None)
        if drive is None:
            return
        drive.span.set_attribute("payonce.state", event.state.value)
        drive.span.set_attribute("payonce.attempt", event.attempts)
        if drive.attempt is not None:  # interrupted before its end was journaled
            drive.attempt.end()
        drive.span.end()
        context.detach(drive.token)

    # -- without a drive ---------------------------------------------------------------------

    def replayed(self, event: IntentReplayed) -> None:
        self._replays.add(1, _series(event, **{"payonce.state": event.state.value}))
        attributes = {
            **_identity(event),
            "payonce.state": event.state.value,
            "payonce.replayed": True,
        }
        if event.status_code is not None:
            attributes["http.response.status_code"] = event.status_code
        self._tracer.start_span("payonce.intent", attributes=attributes).end()

    def reconciled(self, event: IntentReconciled) -> None:
        if event.after is not event.before:
            self._intents.add(1, _series(event, **{"payonce.state": event.after.value}))
        with self._lock:
            lookups = self._lookups.pop(event.key, [])
        now = time.time_ns()
        attributes = {
            **_identity(event),
            "payonce.state": event.after.value,
            "payonce.reconciled": True,
            "payonce.outcome": event.outcome,
        }
        span = self._tracer.start_span(
            "payonce.intent",
            attributes=attributes,
            start_time=min((started for started, _, _ in lookups), default=now),
        )
        for started, ended, found in lookups:
            self._lookup_span(span, started, ended, found)
        if event.after is IntentState.UNKNOWN:
            span.set_status(Status(StatusCode.ERROR, "outcome still unknown"))
        span.end(end_time=now)

    def journal_committed(self, event: JournalCommitted) -> None:
        self._commits.record(event.seconds, {"payonce.durable": event.durable})

    # -- the worker --------------------------------------------------------------------------

    def escalated(self, event: IntentEscalated) -> None:
        self._escalations.add(1, _series(event))
        attributes = {**_identity(event), "payonce.state": "unknown", "payonce.tries": event.tries}
        span = self._tracer.start_span("payonce.escalated", attributes=attributes)
        span.set_status(Status(StatusCode.ERROR, f"outcome still unknown: {event.reason}"))
        span.end()

    def worker_pass(self, event: WorkerPassEnded) -> None:
        for outcome in ("sent", "settled", "escalated", "failed"):
            if count := getattr(event, outcome):
                self._worker_intents.add(count, {"payonce.outcome": outcome})
        self._worker_unknown.set(event.unknown)
        self._worker_passes.record(event.seconds)
