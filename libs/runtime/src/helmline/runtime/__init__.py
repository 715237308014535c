"""Helmline's event-log runtime: the event store on JetStream, consumers, service lifecycle.

Every service stands on this package and `helmline.contracts`; it knows no service.
"""

from helmline.runtime._arguments import (
    ArgumentChecker,
    StepProblem,
    playbook_problems,
    unknown_arguments,
)
from helmline.runtime._cache import SessionCache
from helmline.runtime._consumer import (
    Delivery,
    EventConsumer,
    GatheringHandler,
    Handler,
    consumer_config,
)
from helmline.runtime._deadletters import DeadLetterBox, ParkedLetter, RetryOutcome
from helmline.runtime._embedded import nats_server_binary
from helmline.runtime._errors import (
    ConcurrencyConflict,
    Deferred,
    EventTooLarge,
    HelmlineRuntimeError,
    PermanentError,
    RetryableError,
)
from helmline.runtime._folded_states import FoldedStates
from helmline.runtime._logging import JsonFormatter, configure_logging, log_context
from helmline.runtime._metrics import ServiceMetrics
from helmline.runtime._object_meta import (
    ObjectMeta,
    change_object_meta,
    delete_object,
    delete_object_if,
    live_objects,
)
from helmline.runtime._provision import ensure_topology, provision, stream_config
from helmline.runtime._retry_after import retry_after_s
from helmline.runtime._service import HttpServer, ServiceHost, Setup, run_service
from helmline.runtime._settings import RuntimeSettings
from helmline.runtime._store import (
    Appended,
    EventsOfType,
    EventStore,
    SessionSnapshot,
    StoredEvent,
    bulk_allocation,
)
from helmline.runtime._sweeps import Sweep, sessions_gone
from helmline.runtime._tool_registry import ToolCatalogue, latest_tool_registry, tools_of
from helmline.runtime._tracing import TracingSettings, traceparent_for

__all__ = [
    "Appended",
    "ArgumentChecker",
    "ConcurrencyConflict",
    "DeadLetterBox",
    "Deferred",
    "Delivery",
    "EventConsumer",
    "EventStore",
    "EventTooLarge",
    "EventsOfType",
    "FoldedStates",
    "GatheringHandler",
    "Handler",
    "HelmlineRuntimeError",
    "HttpServer",
    "JsonFormatter",
    "ObjectMeta",
    "ParkedLetter",
    "PermanentError",
    "RetryOutcome",
    "RetryableError",
    "RuntimeSettings",
    "ServiceHost",
    "ServiceMetrics",
    "SessionCache",
    "SessionSnapshot",
    "Setup",
    "StepProblem",
    "StoredEvent",
    "Sweep",
    "ToolCatalogue",
    "TracingSettings",
    "bulk_allocation",
    "change_object_meta",
    "configure_logging",
    "consumer_config",
    "delete_object",
    "delete_object_if",
    "ensure_topology",
    "latest_tool_registry",
    "live_objects",
    "log_context",
    "nats_server_binary",
    "playbook_problems",
    "provision",
    "retry_after_s",
    "run_service",
    "sessions_gone",
    "stream_config",
    "tools_of",
    "traceparent_for",
    "unknown_arguments",
]
