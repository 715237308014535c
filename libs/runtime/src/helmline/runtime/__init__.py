"""Helmline's event-log runtime: the event store on JetStream, consumers, service lifecycle.

Every service stands on this package and `helmline.contracts`; it knows no service.
"""

from helmline.runtime._arguments import (
    ArgumentChecker,
    StepProblem,
    playbook_problems,
    unknown_arguments,
)
from helmline.runtime._cache import LogStates, SessionCache
from helmline.runtime._classifier import (
    ClassifierAnswerError,
    InjectionClassifier,
    InjectionClassifierKind,
    InjectionClassifierSettings,
    classified,
    classifier_answer,
    classifier_request,
    classifier_text,
    with_verdict,
)
from helmline.runtime._consumer import (
    Delivery,
    EventConsumer,
    GatheringHandler,
    Handler,
    consumer_config,
)
from helmline.runtime._deadletters import DeadLetterBox, ParkedLetter, RetryOutcome
from helmline.runtime._durability import (
    RELAXED_RISK,
    Durability,
    DurabilityFindings,
    DurabilityRefused,
    jetstream_config,
)
from helmline.runtime._elections import through_elections
from helmline.runtime._embedded import nats_server_binary, reserve_ports
from helmline.runtime._errors import (
    ConcurrencyConflict,
    Deferred,
    EventTooLarge,
    HelmlineRuntimeError,
    NotHandled,
    PermanentError,
    RetryableError,
    RoutingError,
)
from helmline.runtime._folded_states import FoldedStates
from helmline.runtime._history import History
from helmline.runtime._logging import JsonFormatter, configure_logging, log_context
from helmline.runtime._metrics import NAMESPACE as METRICS_NAMESPACE
from helmline.runtime._metrics import ServiceMetrics
from helmline.runtime._nats_client import NatsClient, connect_nats
from helmline.runtime._object_meta import (
    ObjectMeta,
    change_object_meta,
    delete_object,
    delete_object_if,
    live_objects,
)
from helmline.runtime._output_safety import (
    CLASSIFIER_RULE,
    ERROR_MAX_BYTES,
    NEUTRALISED,
    REDACTED,
    RegisteredSecrets,
    SafeOutput,
    make_error_safe,
    make_safe,
    make_text_safe,
    register_secrets,
    registered_secrets,
)
from helmline.runtime._provision import ensure_topology, provision, stream_config
from helmline.runtime._retry_after import retry_after_s
from helmline.runtime._router import Routed, Router
from helmline.runtime._sealing import (
    SEALING_KEY_FILE,
    BrokenSeal,
    NoSealingKey,
    SealingError,
    SealingKey,
    WrongSealingKey,
    sealing_key,
)
from helmline.runtime._secrets import (
    SECRETS_KEY_FILE,
    SecretRecord,
    SecretsError,
    SecretsKeyError,
    SecretStore,
    UnknownSecret,
    check_name,
    has_references,
    load_secrets_key,
    references_shown,
    resolved_arguments,
)
from helmline.runtime._service import HttpServer, ServiceHost, Setup, run_service
from helmline.runtime._settings import RuntimeSettings, nats_servers
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
from helmline.runtime._urls import without_credentials

__all__ = [
    "CLASSIFIER_RULE",
    "ERROR_MAX_BYTES",
    "METRICS_NAMESPACE",
    "NEUTRALISED",
    "REDACTED",
    "RELAXED_RISK",
    "SEALING_KEY_FILE",
    "SECRETS_KEY_FILE",
    "Appended",
    "ArgumentChecker",
    "BrokenSeal",
    "ClassifierAnswerError",
    "ConcurrencyConflict",
    "DeadLetterBox",
    "Deferred",
    "Delivery",
    "Durability",
    "DurabilityFindings",
    "DurabilityRefused",
    "EventConsumer",
    "EventStore",
    "EventTooLarge",
    "EventsOfType",
    "FoldedStates",
    "GatheringHandler",
    "Handler",
    "HelmlineRuntimeError",
    "History",
    "HttpServer",
    "InjectionClassifier",
    "InjectionClassifierKind",
    "InjectionClassifierSettings",
    "JsonFormatter",
    "LogStates",
    "NatsClient",
    "NoSealingKey",
    "NotHandled",
    "ObjectMeta",
    "ParkedLetter",
    "PermanentError",
    "RegisteredSecrets",
    "RetryOutcome",
    "RetryableError",
    "Routed",
    "Router",
    "RoutingError",
    "RuntimeSettings",
    "SafeOutput",
    "SealingError",
    "SealingKey",
    "SecretRecord",
    "SecretStore",
    "SecretsError",
    "SecretsKeyError",
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
    "UnknownSecret",
    "WrongSealingKey",
    "bulk_allocation",
    "change_object_meta",
    "check_name",
    "classified",
    "classifier_answer",
    "classifier_request",
    "classifier_text",
    "configure_logging",
    "connect_nats",
    "consumer_config",
    "delete_object",
    "delete_object_if",
    "ensure_topology",
    "has_references",
    "jetstream_config",
    "latest_tool_registry",
    "live_objects",
    "load_secrets_key",
    "log_context",
    "make_error_safe",
    "make_safe",
    "make_text_safe",
    "nats_server_binary",
    "nats_servers",
    "playbook_problems",
    "provision",
    "references_shown",
    "register_secrets",
    "registered_secrets",
    "reserve_ports",
    "resolved_arguments",
    "retry_after_s",
    "run_service",
    "sealing_key",
    "sessions_gone",
    "stream_config",
    "through_elections",
    "tools_of",
    "traceparent_for",
    "unknown_arguments",
    "with_verdict",
    "without_credentials",
]
