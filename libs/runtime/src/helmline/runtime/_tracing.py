"""One trace per session, across services, carried in the events themselves.

A session's trace begins with its `session.started` event: the appender's current span, or
else the new trace `new_event` gives it. Every handler runs in a span continuing the context of the
event it handles (the envelope's W3C `traceparent`), and every event appended from inside a
handler carries the handler's span context, so a planner decision, its approval, the tool
call and the sandbox run are spans of the session's one trace.

Spans are exported over OTLP/gRPC when the standard `OTEL_*` variables configure an
endpoint; otherwise tracing is off: no spans are recorded, but trace context still travels
from event to event, so log lines of one session share a trace id.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from helmline.contracts import Event, Headers, ModelExchangeRecorded, ToolError

_PROPAGATOR = TraceContextTextMapPropagator()
TRACER_NAME = "helmline.runtime"
SPAN_FIELDS = ("step_id", "call_id", "tool", "server", "request_id", "provider", "attempt")
"""Payload fields copied onto handling spans as `helmline.<field>`."""


class TracingSettings(BaseSettings):
    """The standard OpenTelemetry variables that decide whether spans are exported.

    The exporter reads the rest itself (`OTEL_EXPORTER_OTLP_HEADERS`, `..._INSECURE`,
    `..._TIMEOUT`, `OTEL_TRACES_SAMPLER`, `OTEL_RESOURCE_ATTRIBUTES`, ...).
    """

    model_config = SettingsConfigDict(extra="ignore")

    endpoint: str | None = Field(default=None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    traces_endpoint: str | None = Field(
        default=None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    traces_exporter: str = Field(default="otlp", validation_alias="OTEL_TRACES_EXPORTER")
    sdk_disabled: bool = Field(default=False, validation_alias="OTEL_SDK_DISABLED")

    @property
    def exporting(self) -> bool:
        """An OTLP endpoint is configured and tracing is not switched off."""
        return (
            not self.sdk_disabled
            and self.traces_exporter != "none"
            and bool(self.endpoint or self.traces_endpoint)
        )


def service_tracer(
    service: str, settings: TracingSettings
) -> tuple[trace.Tracer, TracerProvider | None]:
    """The tracer a service's handlers use, and the provider to shut down (None when off).

    Each service host has its own provider, so services run in one process (tests) still
    report under their own `service.name`.
    """
    if not settings.exporting:
        return trace.NoOpTracer(), None
    # Imported here: gRPC loads only in processes that export.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: f"helmline-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider.get_tracer(TRACER_NAME), provider


def context_of(traceparent: str | None) -> Context:
    """The trace context a W3C traceparent names (empty for none)."""
    if traceparent is None:
        return Context()
    return _PROPAGATOR.extract({Headers.TRACEPARENT: traceparent})


_handled_traceparent: ContextVar[str | None] = ContextVar("helmline_handled_trace", default=None)
"""With tracing off, the trace context of the event being handled: what the events a
handler appends continue, and what its log lines name. (With tracing on, the handler's span
is current and says so itself.)"""


@contextmanager
def handling_span(
    tracer: trace.Tracer, consumer: str, event: Event, traceparent: str | None
) -> Iterator[trace.Span]:
    """A span for handling `event`, continuing the trace `traceparent` names (the event's
    own, or its session's), current while the handler runs."""
    if isinstance(tracer, trace.NoOpTracer):
        # Tracing off: making a span current would cost tens of microseconds an event for
        # a span nobody records; the context is only noted, for new events and log lines.
        token = _handled_traceparent.set(traceparent)
        try:
            yield trace.INVALID_SPAN
        finally:
            _handled_traceparent.reset(token)
        return
    with tracer.start_as_current_span(
        f"{event.type} handle",
        context=context_of(traceparent),
        kind=SpanKind.CONSUMER,
        attributes={"helmline.consumer": consumer, **span_attributes(event)},
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span


@contextmanager
def gathered_spans(
    tracer: trace.Tracer, consumer: str, handled: Sequence[tuple[Event, str | None]]
) -> Iterator[None]:
    """A span for each of events handled together (event, and the traceparent it continues),
    each in its own trace. None is current: what the handler appends continues the trace
    of its cause, which the event derived from it carries."""
    if isinstance(tracer, trace.NoOpTracer):
        yield
        return
    spans = [
        tracer.start_span(
            f"{event.type} handle",
            context=context_of(traceparent),
            kind=SpanKind.CONSUMER,
            attributes={"helmline.consumer": consumer, **span_attributes(event)},
        )
        for event, traceparent in handled
    ]
    try:
        yield
    except Exception as error:
        for span in spans:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        raise
    finally:
        for span in spans:
            span.end()


def span_attributes(event: Event) -> dict[str, str | int | float | bool]:
    """What an operator looks for on a span: whose session, which step, tool and server."""
    attributes: dict[str, str | int | float | bool] = {
        "helmline.tenant": event.tenant,
        "helmline.session_id": event.session_id,
        "helmline.event_type": event.type,
        "helmline.event_id": str(event.id),
    }
    # The payload's own fields, read from its dict: getattr on a missing pydantic field is slow.
    fields = event.data.__dict__
    for field in SPAN_FIELDS:
        value = fields.get(field)
        if isinstance(value, str | int | float | bool):
            attributes[f"helmline.{field}"] = value
    return attributes


def traceparent_for(event: Event) -> str | None:
    """The trace context to store with an event about to be appended: inside a span (a
    handler), that span's context; inside a handler with tracing off, the handled event's;
    otherwise the one the event carries."""
    if not trace.get_current_span().get_span_context().is_valid:
        return _handled_traceparent.get() or event.traceparent
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(Headers.TRACEPARENT, event.traceparent)


def current_trace_ids() -> tuple[str | None, str | None]:
    """The trace and span ids (hex) a log line written now belongs to, if any."""
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        return format(span.trace_id, "032x"), format(span.span_id, "016x")
    # A session's trace may come from a message header, which no schema checked.
    parts = (_handled_traceparent.get() or "").split("-")
    return (parts[1], parts[2]) if len(parts) == 4 else (None, None)


def record_appended(event: Event, size_bytes: int, duplicate: bool) -> None:
    """Note on the current span (if any) that it appended `event`."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    attributes: dict[str, str | int | float | bool] = {
        "helmline.event_id": str(event.id),
        "helmline.size_bytes": size_bytes,
        "helmline.duplicate": duplicate,
    }
    error = event.data.__dict__.get("error")
    if isinstance(error, ToolError):
        attributes["helmline.error_kind"] = error.kind
        span.set_status(Status(StatusCode.ERROR, f"{event.type}: {error.kind}"))
    if isinstance(event.data, ModelExchangeRecorded):
        usage = event.data.reply.usage
        attributes |= {
            "gen_ai.system": event.data.provider,
            "gen_ai.request.model": event.data.request.model,
            "helmline.model_purpose": event.data.purpose,
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "helmline.cost_usd": event.data.cost_usd or 0.0,
        }
    span.add_event(event.type, attributes)
