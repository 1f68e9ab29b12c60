"""payonce.otel against the OpenTelemetry SDK's in-memory exporters (code nobody here wrote),
with a real sandbox over loopback, and beside httpx's own instrumentation."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import payonce
from helpers.payments import PAYMENT, MakeClient, make_unknown
from payonce.otel import OpenTelemetryHooks
from payonce.sandbox import Faults, SandboxServer


class Telemetry:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.hooks = OpenTelemetryHooks(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = self.exporter.get_finished_spans()
        return [s for s in found if name is None or s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, value) of every data point of ``metric``; a histogram's is its count."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        for point in m.data.data_points:
                            value = getattr(point, "value", None)
                            found.append((dict(point.attributes or {}), value or point.count))  # type: ignore[union-attr]
        return found

    def total(self, metric: str, **attributes: Any) -> int:
        return sum(
            value
            for found, value in self.points(metric)
            if all(found.get(f"payonce.{k}") == v for k, v in attributes.items())
        )


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    found = Telemetry()
    yield found
    found.tracer_provider.shutdown()
    found.meter_provider.shutdown()


def test_an_intent_is_a_span_with_a_child_per_attempt_and_its_metrics(
    make_client: MakeClient, sandbox: SandboxServer, telemetry: Telemetry
) -> None:
    client = make_client(hooks=telemetry.hooks)
    sandbox.set_faults(Faults(retry_after_seconds=0))
    sandbox.script(["rate_limit"])

    paid = client.post("/v1/payments", json=PAYMENT, reference="order-o1")
    client.post("/v1/payments", json=PAYMENT, reference="order-o1")

    key = paid.json()["idempotency_key"]
    drive, replay = telemetry.spans("payonce.intent")
    assert drive.attributes is not None
    assert replay.attributes is not None
    assert drive.attributes["payonce.key"] == key
    assert drive.attributes["payonce.reference"] == "order-o1"
    assert (drive.attributes["payonce.provider"], drive.attributes["payonce.account"]) == (
        "sandbox",
        "acct_demo",
    )
    assert drive.attributes["payonce.state"] == "succeeded"
    assert drive.attributes["http.response.status_code"] == 201
    assert drive.attributes["payonce.replayed"] is False
    assert [e.name for e in drive.events] == ["payonce.retry"]
    attempts = telemetry.spans("payonce.attempt")
    assert [s.attributes["payonce.attempt"] for s in attempts] == [1, 2]  # type: ignore[index]
    assert [s.attributes["http.response.status_code"] for s in attempts] == [429, 201]  # type: ignore[index]
    assert {s.parent.span_id for s in attempts if s.parent} == {drive.context.span_id}
    assert all(s.context.trace_id == drive.context.trace_id for s in attempts)
    assert replay.attributes["payonce.replayed"] is True

    assert telemetry.total("payonce.intents", state="succeeded") == 1
    assert telemetry.total("payonce.attempts") == 2
    assert telemetry.total("payonce.retries") == 1
    assert telemetry.total("payonce.replays") == 1
    assert telemetry.total("payonce.unknown_outcomes") == 0
    assert telemetry.total("payonce.journal.commit.duration", durable=True) >= 1
    series = {tuple(sorted(a)) for a, _ in telemetry.points("payonce.intents")}
    assert all("payonce.key" not in names for names in series), "no series per key"


def test_an_unknown_outcome_and_its_reconciliation_are_seen(
    make_client: MakeClient, sandbox: SandboxServer, telemetry: Telemetry
) -> None:
    make_unknown(make_client, sandbox, "order-o2", "drop_after", hooks=telemetry.hooks)
    make_client(hooks=telemetry.hooks).reconcile("order-o2")

    drive, reconciliation = telemetry.spans("payonce.intent")
    assert drive.attributes is not None
    assert drive.attributes["payonce.state"] == "unknown"
    assert drive.status.status_code.name == "ERROR"
    assert "payonce.unknown" in [e.name for e in drive.events]
    assert reconciliation.attributes is not None
    assert reconciliation.attributes["payonce.key"] == drive.attributes["payonce.key"]
    assert reconciliation.attributes["payonce.reconciled"] is True
    assert reconciliation.attributes["payonce.state"] == "succeeded"
    (lookup,) = telemetry.spans("payonce.lookup")
    assert lookup.parent is not None
    assert lookup.parent.span_id == reconciliation.context.span_id, "a child of its intent"
    assert lookup.attributes is not None
    assert (lookup.attributes["payonce.outcome"], lookup.attributes["payonce.before_resend"]) == (
        "found",
        False,
    )
    assert lookup.end_time is not None
    assert reconciliation.start_time is not None
    assert reconciliation.start_time <= lookup.start_time <= lookup.end_time  # type: ignore[operator]
    assert telemetry.total("payonce.unknown_outcomes") == 1
    # Intents by the state they reached: unknown first, then succeeded once reconciled.
    assert telemetry.total("payonce.intents", state="unknown") == 1
    assert telemetry.total("payonce.intents", state="succeeded") == 1


def test_httpx_instrumentation_keeps_working_and_nests_under_the_intent(
    make_client: MakeClient, sandbox: SandboxServer, telemetry: Telemetry
) -> None:
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.tracer_provider)
    try:
        client = make_client(hooks=telemetry.hooks)
        sandbox.set_faults(Faults(retry_after_seconds=0))
        sandbox.script(["rate_limit"])
        paid = client.post("/v1/payments", json=PAYMENT, reference="order-o3")
    finally:
        instrumentor.uninstrument()

    assert paid.status_code == 201
    (drive,) = telemetry.spans("payonce.intent")
    http = [s for s in telemetry.spans() if s.name not in {"payonce.intent", "payonce.attempt"}]
    assert len(http) == 2, [s.name for s in telemetry.spans()]
    statuses = {
        (s.attributes or {}).get("http.response.status_code")
        or (s.attributes or {}).get("http.status_code")
        for s in http
    }
    assert statuses == {429, 201}
    assert {s.parent.span_id for s in http if s.parent} == {drive.context.span_id}


@pytest.mark.anyio
async def test_concurrent_async_intents_each_keep_their_own_spans(
    make_async_client: Callable[..., payonce.AsyncClient],
    sandbox: SandboxServer,
    telemetry: Telemetry,
) -> None:
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.tracer_provider)
    try:
        client = make_async_client(hooks=telemetry.hooks)
        references = [f"order-o4-{n}" for n in range(4)]
        await asyncio.gather(
            *(client.post("/v1/payments", json=PAYMENT, reference=r) for r in references)
        )
    finally:
        instrumentor.uninstrument()

    drives = telemetry.spans("payonce.intent")
    assert sorted(s.attributes["payonce.reference"] for s in drives) == references  # type: ignore[index]
    for drive in drives:
        children = [
            s for s in telemetry.spans() if s.parent and s.parent.span_id == drive.context.span_id
        ]
        assert sorted(s.name for s in children)[-1] == "payonce.attempt"
        assert len(children) == 2, "its attempt, and httpx's span of that attempt's request"
        attempt = next(s for s in children if s.name == "payonce.attempt")
        assert attempt.attributes["payonce.key"] == drive.attributes["payonce.key"]  # type: ignore[index]
    assert telemetry.total("payonce.intents", state="succeeded") == 4


def test_without_opentelemetry_the_import_says_which_extra_to_install() -> None:
    # A fresh interpreter where the opentelemetry package cannot be found.
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "try:\n    import payonce.otel\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'payonce[otel]'" in done.stdout
