"""What observability costs per handled event: metrics, the handling span, a JSON log line.

Each is timed in a tight loop in this process (no I/O): the figures say how much of a step's
latency the runtime's metrics, tracing and logging take.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer, Tracer

from helmline.contracts import EXAMPLE_PAYLOADS, PLANNER_CONSUMER, example_event
from helmline.runtime import JsonFormatter, ServiceMetrics, log_context
from helmline.runtime._tracing import handling_span

ROUNDS = 20_000
EVENTS = [example_event(payload) for payload in EXAMPLE_PAYLOADS]


def per_call_us(work: Callable[[int], None], rounds: int = ROUNDS) -> float:
    """Best of three runs of `rounds` calls, in microseconds per call."""
    timings = []
    for _ in range(3):
        began = time.perf_counter()
        for index in range(rounds):
            work(index)
        timings.append((time.perf_counter() - began) / rounds * 1e6)
    return min(timings)


def _span_cost(tracer: Tracer) -> float:
    def handle(index: int) -> None:
        event = EVENTS[index % len(EVENTS)]
        with handling_span(tracer, "bench", event, event.traceparent):
            pass

    return per_call_us(handle)


async def run() -> list[dict[str, Any]]:
    metrics = ServiceMetrics("bench")

    def observe(index: int) -> None:
        event = EVENTS[index % len(EVENTS)]
        metrics.appended(event, duplicate=False)
        metrics.handled(PLANNER_CONSUMER, event, "ok", 0.001)

    exporting = TracerProvider()
    exporting.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    formatter = JsonFormatter("bench")
    record = logging.LogRecord("bench", logging.INFO, __file__, 1, "handled %s", ("x",), None)

    def log_line(index: int) -> None:
        with log_context(tenant="t", session_id="s"):
            formatter.format(record)

    return [
        {
            "figure": "metrics_per_event_us",
            "case": "one event appended and handled, every catalogue type in turn",
            "value": round(per_call_us(observe), 2),
        },
        {
            "figure": "handling_span_us",
            "case": "tracing off (no OTEL endpoint): context carried only",
            "value": round(_span_cost(NoOpTracer()), 2),
        },
        {
            "figure": "handling_span_us",
            "case": "tracing on: span recorded and handed to an in-memory exporter",
            "value": round(_span_cost(exporting.get_tracer("bench")), 2),
        },
        {
            "figure": "json_log_line_us",
            "case": "one log line formatted with session, tenant and trace ids",
            "value": round(per_call_us(log_line), 2),
        },
    ]
