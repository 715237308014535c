"""Metrics derived from events, JSON log lines, and trace context carried by appended events."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helmline.contracts import (
    EVENTS_STREAM,
    EXAMPLE_PAYLOADS,
    PLANNER_CONSUMER,
    SANDBOX_CONSUMER,
    Actor,
    ConsumerSpec,
    Event,
    SessionCompleted,
    SessionPauseRequested,
    SessionStarted,
    ThoughtRecorded,
    example_event,
    new_event,
    tenant_filter,
)
from helmline.runtime import (
    Delivery,
    EventConsumer,
    EventStore,
    JsonFormatter,
    ServiceMetrics,
    configure_logging,
    log_context,
)
from helmline.runtime._logging import CHATTY_HTTP_CLIENTS
from helmline.runtime._tracing import traceparent_for
from helmline.runtime.testing import eventually, session_started


def _every_event_of(tenant: str, name: str) -> ConsumerSpec:
    return ConsumerSpec(
        durable=f"{name}-{tenant}",
        stream=EVENTS_STREAM.name,
        filter_subjects=(tenant_filter(tenant),),
        description="test consumer",
    )


def _samples(metrics: ServiceMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_every_event_type_can_be_observed_appended_and_handled() -> None:
    metrics = ServiceMetrics("test")
    for payload in EXAMPLE_PAYLOADS:
        event = example_event(payload)
        metrics.appended(event, duplicate=False)
        metrics.handled(PLANNER_CONSUMER, event, "ok", 0.001)
    samples = _samples(metrics)
    assert samples["helmline_tool_calls_total{server=builtin,status=completed,tool=run_command}"]
    assert samples["helmline_sessions_started_total{mode=playbook}"] == 1
    appended = [k for k in samples if k.startswith("helmline_events_appended_total{")]
    assert len(appended) == len(EXAMPLE_PAYLOADS)


def test_a_session_is_counted_once_with_its_duration_and_duplicates_are_not() -> None:
    metrics = ServiceMetrics("planner")
    started = session_started("t", "s")
    completed = started.derive(SessionCompleted(), source="test")
    metrics.handled(PLANNER_CONSUMER, started, "ok", 0.001)
    assert _samples(metrics)["helmline_sessions_active{}"] == 1
    metrics.appended(completed, duplicate=False)
    metrics.appended(completed, duplicate=True)
    samples = _samples(metrics)
    assert samples["helmline_sessions_ended_total{outcome=completed}"] == 1
    assert samples["helmline_session_duration_seconds_count{outcome=completed}"] == 1
    assert samples["helmline_sessions_active{}"] == 0


def test_a_session_is_counted_only_by_the_service_that_ends_it() -> None:
    # The sandbox hears every session start (to restore a fork's workspace), never its end:
    # counting there, active sessions would only grow, and every start would count twice.
    sandbox = ServiceMetrics("sandbox")
    sandbox.handled(SANDBOX_CONSUMER, session_started("t", "s"), "ok", 0.001)
    samples = _samples(sandbox)
    assert samples["helmline_sessions_active{}"] == 0
    assert "helmline_sessions_started_total{mode=playbook}" not in samples


def test_a_log_line_is_json_with_the_session_and_trace_it_was_written_in() -> None:
    provider = TracerProvider()
    record = logging.LogRecord("helmline.test", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    formatter = JsonFormatter("planner")
    outside = json.loads(formatter.format(record))
    assert outside["session_id"] is None
    assert outside["trace_id"] is None
    with (
        provider.get_tracer("test").start_as_current_span("handle") as span,
        log_context(tenant="t", session_id="s"),
    ):
        inside = json.loads(formatter.format(record))
    assert inside["message"] == "hello x"
    assert (inside["tenant"], inside["session_id"], inside["service"]) == ("t", "s", "planner")
    assert inside["trace_id"] == format(span.get_span_context().trace_id, "032x")


async def test_an_event_appended_inside_a_span_carries_that_span(
    store: EventStore, tenant: str
) -> None:
    started = session_started(tenant, "s")
    assert started.traceparent is not None, "a session begins a trace"
    await store.append(started)
    provider = TracerProvider()
    with provider.get_tracer("test").start_as_current_span("handle") as span:
        await store.append(started.derive(SessionCompleted(), source="test"))
    stored = [item.event for item in await store.read_all(tenant, "s")]
    assert stored[0].traceparent == started.traceparent
    context = span.get_span_context()
    assert stored[1].traceparent is not None
    assert stored[1].traceparent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert not trace.get_current_span().get_span_context().is_valid


async def test_with_tracing_off_a_handler_still_continues_the_trace_it_handles(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    formatter = JsonFormatter("test")
    lines: list[dict[str, object]] = []

    async def think(delivery: Delivery) -> None:
        if not isinstance(delivery.event.data, SessionStarted):
            return
        record = logging.LogRecord("t", logging.INFO, __file__, 1, "thinking", (), None)
        lines.append(json.loads(formatter.format(record)))
        # Appended as a new event, not derived: the trace comes from the handling alone.
        thought = new_event(
            ThoughtRecorded(kind="reasoning", text="t"),
            tenant=tenant,
            session_id="s",
            source="test",
        )
        await store.append(thought)

    consumer = EventConsumer(
        nc, js, _every_event_of(tenant, "trace"), think
    )  # no tracer: tracing is off
    await consumer.start()
    try:
        started = session_started(tenant, "s")
        await store.append(started)
        await eventually(lambda: len(lines) == 1, what="the session start handled")

        async def both_stored() -> list[Event] | None:
            events = [item.event for item in await store.read_all(tenant, "s")]
            return events if len(events) == 2 else None

        stored = await eventually(both_stored, what="the thought appended")
    finally:
        await consumer.stop(grace_s=1)
    assert started.traceparent is not None
    _, trace_id, span_id, _ = started.traceparent.split("-")
    assert (lines[0]["trace_id"], lines[0]["span_id"]) == (trace_id, span_id)
    assert stored[1].traceparent == started.traceparent


async def test_an_intent_continues_the_trace_where_its_sessions_latest_event_left_it(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    formatter = JsonFormatter("test")
    seen: dict[str, tuple[object, object]] = {}

    async def note(delivery: Delivery) -> None:
        record = logging.LogRecord("t", logging.INFO, __file__, 1, "handling", (), None)
        line = json.loads(formatter.format(record))
        seen[delivery.event.type] = (line["trace_id"], line["span_id"])

    consumer = EventConsumer(nc, js, _every_event_of(tenant, "intent"), note)
    await consumer.start()
    try:
        started = session_started(tenant, "s")
        provider = TracerProvider()
        with provider.get_tracer("test").start_as_current_span("planning") as planning:
            thought = started.derive(ThoughtRecorded(kind="reasoning", text="t"), source="test")
            thought = thought.model_copy(update={"traceparent": traceparent_for(thought)})
        # A person's pause: no cause, appended outside any span.
        pause = new_event(
            SessionPauseRequested(requested_by=Actor(id="ana")),
            tenant=tenant,
            session_id="s",
            source="cli",
        )
        assert pause.traceparent is None
        assert pause.causation_id is None
        await store.append_all([started, thought, pause])
        await eventually(lambda: len(seen) == 3, what="the three events handled")
    finally:
        await consumer.stop(grace_s=1)
    context = planning.get_span_context()
    assert seen[pause.type] == (f"{context.trace_id:032x}", f"{context.span_id:016x}")


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    clients = {name: logging.getLogger(name).level for name in CHATTY_HTTP_CLIENTS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, client_level in clients.items():
        logging.getLogger(name).setLevel(client_level)


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
@pytest.mark.usefixtures("restored_logging")
def test_http_clients_log_each_request_only_at_debug(
    capsys: pytest.CaptureFixture[str], level: str, shown: bool
) -> None:
    configure_logging("test", level, "text")
    logging.getLogger("httpx2").info('HTTP Request: POST http://mcp/ "HTTP/1.1 200 OK"')
    logging.getLogger("helmline.test").info("the service's own line")
    logged = capsys.readouterr().err
    assert "the service's own line" in logged
    assert ("HTTP Request" in logged) is shown
