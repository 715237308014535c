"""Subjects, headers, streams, consumers and buckets, as data.

This is the only module that spells a subject or a header name. Deployment provisions
streams, consumers and buckets from these definitions, and services subscribe through them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import (
    API,
    APPROVAL,
    PLANNER,
    SANDBOX,
    SERVICES,
    STATE,
    TOOL_GATEWAY,
)
from helmline.contracts._values import Contract
from helmline.contracts.events import (
    PAYLOAD_CLASSES,
    ApprovalDecisionSubmitted,
    ApprovalRequested,
    CompensationCompleted,
    CompensationFailed,
    CompensationScheduled,
    McpInstanceStarted,
    McpInstanceStopped,
    PermissionRequested,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    RollbackRequested,
    SandboxExecutionRequested,
    SessionCancelled,
    SessionCancelRequested,
    SessionCompleted,
    SessionFailed,
    SessionPaused,
    SessionPauseRequested,
    SessionResumed,
    SessionResumeRequested,
    SessionStarted,
    StepAuthorized,
    StepScheduled,
    StreamLimitApproaching,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolCircuitChanged,
    ToolDefinitionAccepted,
    ToolDefinitionChanged,
    ToolDefinitionPinned,
    ToolRegistryPublished,
    ToolServerHealthChanged,
    WorkspaceRestored,
    WorkspaceSnapshotsPruned,
    WorkspaceSnapshotted,
    keys,
)

EVENTS_SUBJECT_PREFIX = "helmline.events"
DEAD_LETTER_SUBJECT_PREFIX = "helmline.deadletter"
DELIVER_SUBJECT_PREFIX = "helmline.deliver"
RETRY_SUBJECT_PREFIX = "helmline.retry"
TOOLS_SUBJECT_PREFIX = "helmline.tools"
OPS_SUBJECT_PREFIX = "helmline.ops"
KEYS_SUBJECT_PREFIX = "helmline.keys"

TOOL_REGISTRY_SUBJECT = f"{TOOLS_SUBJECT_PREFIX}.registry"
"""Where gateways publish `tool.registry.published`; the newest message is the registry."""

TOOLS_TENANT = "system"
TOOLS_SESSION = "tool-gateway"
"""Tenant and session named in the envelopes of gateway-wide events (registry, circuits),
which belong to no session and live on the tools stream, not in the events stream."""


RETENTION_SUBJECT = f"{OPS_SUBJECT_PREFIX}.retention"
"""Where the state service publishes `stream.limit_approaching`."""

OPS_TENANT = "system"
OPS_SESSION = "retention"
"""Tenant and session named in the envelopes of stream-wide notices, which belong to no
session and live on the ops stream, not in the events stream."""


KEYS_SESSION = "api-keys"
"""Session named in the envelopes of API key events (whose tenant is the key's), which
belong to no session and live on the keys stream, not in the events stream."""


def api_key_subject(tenant: str, key_id: str) -> str:
    """Where one key's `api.key.*` events are published."""
    return f"{KEYS_SUBJECT_PREFIX}.{tenant}.{key_id}"


ALL_API_KEYS = f"{KEYS_SUBJECT_PREFIX}.>"
"""Every key's events, of every tenant: what each API replica follows."""


def circuit_subject(server: str) -> str:
    """Where a server's `tool.circuit.changed` events are published."""
    return f"{TOOLS_SUBJECT_PREFIX}.circuit.{server}"


ALL_CIRCUITS = f"{TOOLS_SUBJECT_PREFIX}.circuit.*"
"""Every server's circuit changes."""


def server_health_subject(server: str) -> str:
    """Where a server's `tool.server.health_changed` events are published."""
    return f"{TOOLS_SUBJECT_PREFIX}.health.{server}"


ALL_SERVER_HEALTH = f"{TOOLS_SUBJECT_PREFIX}.health.*"
"""Every server's health changes."""


def tool_definition_subject(tool: str) -> str:
    """Where a tool's `tool.definition.*` events (pinned, changed, accepted) are published."""
    return f"{TOOLS_SUBJECT_PREFIX}.definition.{tool}"


ALL_TOOL_DEFINITIONS = f"{TOOLS_SUBJECT_PREFIX}.definition.>"
"""Every tool's definition events (a tool's name may hold dots, hence `>`)."""

_NOBODY = "_"
"""Stands for no tenant or no session in an instance's subject (ids never begin with `_`)."""


def mcp_instance_subject(server: str, tenant: str | None, session_id: str | None) -> str:
    """Where the `mcp.instance.*` events of a server's instance for a tenant or a session
    (neither for a shared one) are published: the newest tells whether one runs."""
    return f"{TOOLS_SUBJECT_PREFIX}.instance.{server}.{tenant or _NOBODY}.{session_id or _NOBODY}"


ALL_MCP_INSTANCES = f"{TOOLS_SUBJECT_PREFIX}.instance.>"
"""Every server's instances' events."""

MCP_CALLS_SUBJECT_PREFIX = "helmline.mcp-calls"


def mcp_instance_calls_subject(instance: str) -> str:
    """Where the gateway process that runs an MCP server's instance (`mcp.instance.started`)
    takes calls for it from the other gateway processes, as NATS requests answered at once:
    no stream keeps them."""
    return f"{MCP_CALLS_SUBJECT_PREFIX}.{instance}"


ALL_MCP_INSTANCE_CALLS = f"{MCP_CALLS_SUBJECT_PREFIX}.>"
"""Calls handed to every instance's gateway process."""


class Channel(NamedTuple):
    """Where events that belong to no session are published, on a stream of their own."""

    address: str
    """Their subject, with `{parameters}` where it varies (as AsyncAPI writes it)."""
    covers: str
    """Every subject of the channel, as a filter: what its publishers may publish to."""
    parameters: Mapping[str, str] = {}
    """What each parameter of the address is ("" for one AsyncAPI's components describe)."""


_MCP_SERVER = {"server": "The MCP server."}

SESSIONLESS_CHANNELS: dict[type[Payload], Channel] = {
    ToolRegistryPublished: Channel(TOOL_REGISTRY_SUBJECT, TOOL_REGISTRY_SUBJECT),
    ToolCircuitChanged: Channel(circuit_subject("{server}"), ALL_CIRCUITS, _MCP_SERVER),
    ToolServerHealthChanged: Channel(
        server_health_subject("{server}"), ALL_SERVER_HEALTH, _MCP_SERVER
    ),
    **dict.fromkeys(
        (ToolDefinitionPinned, ToolDefinitionChanged, ToolDefinitionAccepted),
        Channel(
            tool_definition_subject("{tool}"),
            ALL_TOOL_DEFINITIONS,
            {"tool": "The tool, as the registry names it."},
        ),
    ),
    **dict.fromkeys(
        (McpInstanceStarted, McpInstanceStopped),
        Channel(
            mcp_instance_subject("{server}", "{tenant}", "{session}"),
            ALL_MCP_INSTANCES,
            {
                **_MCP_SERVER,
                "tenant": "The tenant the instance serves; `_` for a shared one.",
                "session": "The session the instance serves; `_` unless isolated per session.",
            },
        ),
    ),
    StreamLimitApproaching: Channel(RETENTION_SUBJECT, RETENTION_SUBJECT),
    # Every event of the keys aggregate is on the keys stream, on its key's subject.
    **dict.fromkeys(
        (payload for payload in PAYLOAD_CLASSES if payload.__module__ == keys.__name__),
        Channel(
            api_key_subject("{tenant}", "{keyId}"),
            ALL_API_KEYS,
            {"tenant": "", "keyId": "The API key's id (never its secret)."},
        ),
    ),
}
"""The event types that belong to no session, and where each is published; every other
event type is in a session's log, on `event_subject`. A new one is declared here, beside
its subject: AsyncAPI, the publish permissions and the fold (which never sees one) follow."""


class EventSubject(NamedTuple):
    """The parts of an event subject."""

    tenant: str
    session_id: str
    event_type: str


def event_subject(tenant: str, session_id: str, event_type: str) -> str:
    """`helmline.events.<tenant>.<session_id>.<event.type>` — where an event is published."""
    return f"{EVENTS_SUBJECT_PREFIX}.{tenant}.{session_id}.{event_type}"


def session_filter(tenant: str, session_id: str) -> str:
    """Every event of one session."""
    return f"{EVENTS_SUBJECT_PREFIX}.{tenant}.{session_id}.>"


def tenant_filter(tenant: str) -> str:
    """Every event of one tenant."""
    return f"{EVENTS_SUBJECT_PREFIX}.{tenant}.>"


def event_type_filter(event_type: str, tenant: str = "*") -> str:
    """Every event of one type (which may end in `*`, as `tool.call.*`) of one or all tenants."""
    return f"{EVENTS_SUBJECT_PREFIX}.{tenant}.*.{event_type}"


ALL_EVENTS = f"{EVENTS_SUBJECT_PREFIX}.>"
"""Every session event of every tenant."""


def parse_event_subject(subject: str) -> EventSubject:
    """Split an event subject into tenant, session id and event type."""
    prefix = EVENTS_SUBJECT_PREFIX + "."
    if not subject.startswith(prefix):
        raise ValueError(f"not an event subject: {subject!r}")
    parts = subject[len(prefix) :].split(".", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"not an event subject: {subject!r}")
    return EventSubject(parts[0], parts[1], parts[2])


def deliver_subject(durable: str) -> str:
    """Where JetStream pushes a durable consumer's messages to the service's replicas."""
    return f"{DELIVER_SUBJECT_PREFIX}.{durable}"


def retry_subject(consumer: str) -> str:
    """Where a consumer's replicas take requests to handle a dead-lettered message again."""
    return f"{RETRY_SUBJECT_PREFIX}.{consumer}"


def dead_letter_subject(consumer: str) -> str:
    """Where a consumer's poison messages are parked, with the reason."""
    return f"{DEAD_LETTER_SUBJECT_PREFIX}.{consumer}"


class Headers:
    """NATS header names used on event messages."""

    MSG_ID = "Nats-Msg-Id"
    EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
    EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
    TRACEPARENT = "traceparent"
    EVENT_TYPE = "ce-type"
    DEAD_LETTER_REASON = "Helmline-Dead-Letter-Reason"
    BATCH_ID = "Nats-Batch-Id"
    BATCH_SEQUENCE = "Nats-Batch-Sequence"
    BATCH_COMMIT = "Nats-Batch-Commit"


class StreamSpec(Contract):
    """A JetStream stream."""

    name: str
    """Stream name."""
    subjects: tuple[str, ...]
    """Subjects the stream captures."""
    description: str
    """What the stream holds."""
    duplicate_window_s: float = 120.0
    """How long JetStream remembers message ids to drop re-published duplicates."""
    max_age_s: float | None = None
    """How long messages are kept; None keeps them for ever."""
    max_bytes: int | None = None
    """How many bytes the stream may hold (the oldest messages go first); None: no limit."""
    max_msg_size: int = 1024 * 1024
    """Largest message accepted, in bytes."""
    append_only: bool = True
    """Deny deleting messages and purging: the log is never rewritten."""
    atomic_batches: bool = False
    """Accept batches of messages stored all together or not at all (up to
    `ATOMIC_BATCH_LIMIT` each), which readers never see in part."""


ATOMIC_BATCH_LIMIT = 1000
"""Most messages nats-server takes in one atomic batch."""


class ConsumerSpec(Contract):
    """A durable consumer shared by every replica of a service."""

    durable: str
    """Consumer name; replicas share it and split the messages between them."""
    stream: str
    """The stream consumed."""
    filter_subjects: tuple[str, ...]
    """Subjects delivered to the service."""
    description: str
    """What the service does with them."""
    ack_wait_s: float = 2.0
    """Seconds before an unacknowledged message is delivered again: how long the work a
    killed replica held waits before another replica takes it up. Handlers still running
    (and messages waiting for their session's earlier ones) are marked in progress every
    third of it, so only a replica silent for two thirds of it loses its messages."""
    max_deliver: int = Field(default=5, ge=1)
    """Deliveries before a message is dead-lettered."""
    max_ack_pending: int = Field(default=1000, ge=1)
    """Messages in flight at once across all replicas."""
    in_session_order: bool = True
    """Hand a session's events over one at a time, in stream order. Off for services whose
    work on one event must not wait for another (a sandbox killing a running command)."""
    gather_s: float = Field(default=0.0, ge=0.0, le=1.0)
    """Seconds that events the service may handle late gather before it handles them
    together (0: each at once). For work off every critical path, where handling many
    events in one go costs a fraction of handling each alone."""
    counts_sessions: bool = False
    """Whether the service's metrics count the sessions this consumer hears start: only
    for the consumer of the service that also ends them, so that each session is counted
    once, and ended where it was counted, across all services."""
    decides: bool = True
    """Whether the service decides on these events (appends, runs tools): then an event is
    handed over only while the log holds neither the service's decision on it nor the
    session's end after it, so that history (an import, a mirror, a consumer reset) is
    never acted on. False for a projection, which applies every event, history or not."""
    decides_after_end: bool = False
    """Whether the service still decides on events from before a session's end once the
    session has ended: it records what happened (checkpoints are made behind the steps,
    some after the end) rather than starting work, which no service does for a session
    that has ended."""


class KeyValueSpec(Contract):
    """A JetStream key-value bucket."""

    bucket: str
    """Bucket name."""
    description: str
    """What it holds."""
    history: int = 1
    """Values kept per key."""
    ttl_s: float | None = None
    """How long a value lives; None keeps it."""


class ObjectStoreSpec(Contract):
    """A JetStream object store."""

    bucket: str
    """Bucket name."""
    description: str
    """What it holds."""


EVENTS_STREAM = StreamSpec(
    name="HELMLINE_EVENTS",
    subjects=(ALL_EVENTS,),
    description="Every session's events: the append-only log all state is derived from.",
    atomic_batches=True,
)

DEAD_LETTER_STREAM = StreamSpec(
    name="HELMLINE_DEADLETTER",
    subjects=(f"{DEAD_LETTER_SUBJECT_PREFIX}.>",),
    description="Messages a consumer could not process, with the reason; kept for 30 days.",
    max_age_s=30 * 24 * 3600.0,
    max_msg_size=2 * 1024 * 1024,
    append_only=False,
)

TOOLS_STREAM = StreamSpec(
    name="HELMLINE_TOOLS",
    subjects=(f"{TOOLS_SUBJECT_PREFIX}.>",),
    description="The tool registry as gateways publish it, circuit breaker and MCP server "
    "health changes; kept for 30 days (the newest registry message is the registry).",
    max_age_s=30 * 24 * 3600.0,
    max_msg_size=8 * 1024 * 1024,
    append_only=False,
)

OPS_STREAM = StreamSpec(
    name="HELMLINE_OPS",
    subjects=(f"{OPS_SUBJECT_PREFIX}.>",),
    description="Operational notices, such as a stream nearing its limits; kept for 30 days.",
    max_age_s=30 * 24 * 3600.0,
    append_only=False,
)

KEYS_STREAM = StreamSpec(
    name="HELMLINE_KEYS",
    subjects=(ALL_API_KEYS,),
    description="API keys made, rotated and revoked (never a secret): what every API replica "
    "follows to refuse a revoked key at once, and the credentials' audit trail, kept for ever.",
)

STREAMS: tuple[StreamSpec, ...] = (
    EVENTS_STREAM,
    DEAD_LETTER_STREAM,
    TOOLS_STREAM,
    OPS_STREAM,
    KEYS_STREAM,
)

RATE_LIMITS_BUCKET = KeyValueSpec(
    bucket="helmline_rate_limits",
    description="Rate-limit counters per tool and tenant, shared by gateway replicas.",
    ttl_s=3600.0,
)

API_KEYS_BUCKET = KeyValueSpec(
    bucket="helmline_api_keys",
    description="API keys by key id: tenant, roles and the SHA-256 of the secret (never the "
    "secret itself).",
)

WORKSPACES_BUCKET = ObjectStoreSpec(
    bucket="helmline_workspaces",
    description="Workspace snapshots that checkpoints refer to.",
)

TOOL_OUTPUTS_BUCKET = ObjectStoreSpec(
    bucket="helmline_tool_outputs",
    description="Tool outputs as they came, before caps, redaction and neutralising; events "
    "refer to them for people allowed to see them.",
)

SESSION_STATES_BUCKET = KeyValueSpec(
    bucket="helmline_session_states",
    description="Sessions' folded states at some of their sequences, so that the state at any "
    "sequence is the nearest one stored plus a fold of the events after it; a cache of the "
    "log, dropped and rebuilt at will.",
)

TOOL_RESULTS_BUCKET = KeyValueSpec(
    bucket="helmline_tool_results",
    description="Where each session's results of pure tools are logged (a stream sequence), "
    "by tool and arguments, so that the same call is answered from the log; kept for a day.",
    ttl_s=24 * 3600.0,
)

SECRETS_BUCKET = KeyValueSpec(
    bucket="helmline_secrets",
    description="Secrets by tenant and name (`<tenant>.<name>`), each value sealed with a key "
    "that is never in NATS, beside who set or removed it and when; its history of 64 "
    "revisions a secret is the audit trail of setting and removing it.",
    history=64,
)

KEY_VALUE_BUCKETS: tuple[KeyValueSpec, ...] = (
    RATE_LIMITS_BUCKET,
    TOOL_RESULTS_BUCKET,
    API_KEYS_BUCKET,
    SESSION_STATES_BUCKET,
    SECRETS_BUCKET,
)
OBJECT_STORES: tuple[ObjectStoreSpec, ...] = (WORKSPACES_BUCKET, TOOL_OUTPUTS_BUCKET)


def consumer_for(
    service: str, payloads: Iterable[type[Payload]], description: str, **settings: Any
) -> ConsumerSpec:
    """The durable consumer of a service that reacts to the given event types."""
    return ConsumerSpec(
        durable=f"helmline-{service}",
        stream=EVENTS_STREAM.name,
        filter_subjects=tuple(event_type_filter(payload.TYPE) for payload in payloads),
        description=description,
        **settings,
    )


def received_payloads(consumer: ConsumerSpec) -> tuple[type[Payload], ...]:
    """The event types a consumer may be handed: those whose subject one of its filters
    matches, for some tenant and session. What a service's handlers must handle (see
    `helmline.runtime.Router`)."""
    return tuple(
        payload
        for payload in PAYLOAD_CLASSES
        if any(_may_match(f, payload.TYPE) for f in consumer.filter_subjects)
    )


def _may_match(filter_subject: str, event_type: str) -> bool:
    """Whether NATS would deliver an event of `event_type` of some tenant and session to
    `filter_subject` (`*` matches one token, `>` the rest)."""
    # Tenant and session are `*` here: any of them may come.
    subject = event_subject("*", "*", event_type).split(".")
    tokens = filter_subject.split(".")
    for index, token in enumerate(tokens):
        if token == ">":
            return len(subject) > index
        if index >= len(subject):
            return False
        if token != "*" and subject[index] not in ("*", token):
            return False
    return len(tokens) == len(subject)


PLANNER_CONSUMER = consumer_for(
    "planner",
    (
        SessionStarted,
        PlanApproved,
        PlanRejected,
        ToolCallCompleted,
        ToolCallFailed,
        ToolCallDenied,
        SessionPauseRequested,
        SessionResumeRequested,
        SessionCancelRequested,
        # No step starts while a rollback runs; a fork starts once its workspace is restored.
        RollbackRequested,
        RollbackRefused,
        RollbackCompleted,
        RollbackFailed,
        WorkspaceRestored,
    ),
    "Plans sessions, schedules steps whose dependencies are met, ends sessions.",
    counts_sessions=True,
)
APPROVAL_CONSUMER = consumer_for(
    "approval",
    (
        PlanProposed,
        StepScheduled,
        ApprovalRequested,
        PermissionRequested,
        ApprovalDecisionSubmitted,
        # A grant while the session is paused lets its call run only once it resumes.
        SessionPaused,
        SessionResumed,
        # A session's end withdraws its open requests: no timer is kept for them.
        SessionCompleted,
        SessionFailed,
        SessionCancelled,
    ),
    "Decides by policy what runs, asks people where needed, expires unanswered requests; "
    "holds calls granted while their session is paused until it resumes.",
)
TOOL_GATEWAY_CONSUMER = consumer_for(
    "tool-gateway",
    # A step whose call its approved plan authorised runs when scheduled; planners before
    # `step.authorized` said so on `step.scheduled`. A session's end stops the MCP server
    # instances kept for it.
    (
        ToolCallAuthorized,
        StepAuthorized,
        StepScheduled,
        SessionCompleted,
        SessionFailed,
        SessionCancelled,
    ),
    "Validates authorised calls (and calls scheduled as their approved plan authorised "
    "them), runs pure tools, hands the rest to the sandbox; stops the MCP server instances "
    "of sessions that ended.",
)
SANDBOX_CONSUMER = consumer_for(
    "sandbox",
    (
        SandboxExecutionRequested,
        SessionCancelRequested,
        CompensationScheduled,
        WorkspaceSnapshotsPruned,
        SessionStarted,
        SessionCompleted,
        SessionFailed,
        SessionCancelled,
    ),
    "Runs built-in tools in session workspaces; kills running commands on cancel; restores "
    "workspaces for rollbacks and forks; deletes pruned snapshots; removes ended sessions' "
    "workspaces from its disk.",
    # A command may run for minutes; its message is kept in progress meanwhile. A cancel
    # must reach the command it kills, and parallel steps run in parallel.
    max_ack_pending=256,
    in_session_order=False,
)
STATE_CONSUMER = consumer_for(
    "state",
    (
        ToolCallCompleted,
        ToolCallFailed,
        ToolCallDenied,
        WorkspaceSnapshotted,
        WorkspaceRestored,
        RollbackRequested,
        CompensationCompleted,
        CompensationFailed,
    ),
    "Records a checkpoint after every completed step; drives rollbacks, one compensation "
    "at a time.",
    # Checkpoints are off the steps' path: made 20 ms late but many at once, they leave
    # the processor to the services on it. Rollback events are handled at once.
    gather_s=0.02,
    decides_after_end=True,
)

READ_MODEL_CONSUMER = ConsumerSpec(
    durable="helmline-state-read-model",
    stream=EVENTS_STREAM.name,
    filter_subjects=(ALL_EVENTS,),
    description="Projects every session into the PostgreSQL read model.",
    decides=False,
    # PostgreSQL may be down for a while: keep redelivering (with backoff) until it is back,
    # since the log, not the read model, is the source.
    max_deliver=100_000,
    # A transaction per event cost about as much processor time as the three services on a
    # step's path together.
    gather_s=0.02,
)

SERVICE_CONSUMERS: tuple[ConsumerSpec, ...] = (
    PLANNER_CONSUMER,
    APPROVAL_CONSUMER,
    TOOL_GATEWAY_CONSUMER,
    SANDBOX_CONSUMER,
    STATE_CONSUMER,
    READ_MODEL_CONSUMER,
)
"""Every service's durable consumer, for provisioning and for operators."""


# --- who may publish what -----------------------------------------------------------------

EVENT_PUBLISHERS: dict[type[Payload], tuple[str, ...]] = {
    payload: payload.PUBLISHED_BY
    for payload in PAYLOAD_CLASSES
    if payload not in SESSIONLESS_CHANNELS
}
"""The services that append each session event type, as its class declares them: each
service's NATS user may publish only these types' subjects in sessions' logs."""

SUBJECT_PUBLISHERS: dict[str, tuple[str, ...]] = {}
for _payload, _channel in SESSIONLESS_CHANNELS.items():
    _known = SUBJECT_PUBLISHERS.get(_channel.covers, ())
    SUBJECT_PUBLISHERS[_channel.covers] = (
        *_known,
        *(owner for owner in _payload.PUBLISHED_BY if owner not in _known),
    )
# Not events: a gateway process hands a call to the one that runs the instance it needs.
SUBJECT_PUBLISHERS[ALL_MCP_INSTANCE_CALLS] = (TOOL_GATEWAY,)
"""Subjects outside the events stream and who publishes on them: the publishers their
events' classes declare, and the gateway's calls handed to another gateway process."""

BUCKET_WRITERS: dict[str, tuple[str, ...]] = {
    RATE_LIMITS_BUCKET.bucket: (TOOL_GATEWAY,),
    TOOL_RESULTS_BUCKET.bucket: (TOOL_GATEWAY,),
    API_KEYS_BUCKET.bucket: (API,),
    WORKSPACES_BUCKET.bucket: (SANDBOX,),
    TOOL_OUTPUTS_BUCKET.bucket: (TOOL_GATEWAY,),
    SESSION_STATES_BUCKET.bucket: (STATE,),
    # Set and removed by people with the CLI, as NATS admin; services only read it.
    SECRETS_BUCKET.bucket: (),
}
"""The services that write each key-value bucket and object store (every service may read
them); none: only NATS admins (people, with the CLI). Every bucket needs a line here (a test
fails without one)."""

SERVICE_CONSUMER_NAMES: dict[str, tuple[str, ...]] = {
    PLANNER: (PLANNER_CONSUMER.durable,),
    APPROVAL: (APPROVAL_CONSUMER.durable,),
    TOOL_GATEWAY: (TOOL_GATEWAY_CONSUMER.durable,),
    SANDBOX: (SANDBOX_CONSUMER.durable,),
    STATE: (STATE_CONSUMER.durable, READ_MODEL_CONSUMER.durable),
    API: (),
}
"""The durable consumers each service runs (it parks their dead letters)."""


class NatsPermissions(Contract):
    """What one service's NATS user may publish (subscribing is not restricted)."""

    publish_allow: tuple[str, ...]
    """Subjects it may publish to: its own event types, its dead letters, the buckets it
    writes, JetStream's API for Helmline's streams and buckets, and replies; nothing else."""


def published_by(service: str) -> tuple[type[Payload], ...]:
    """The event types `service` appends."""
    return tuple(payload for payload, owners in EVENT_PUBLISHERS.items() if service in owners)


def source_of(service: str) -> str:
    """The CloudEvents `source` of the events `service` appends."""
    return f"helmline/{service}"


SESSION_ENDINGS: frozenset[str] = frozenset(
    payload.TYPE for payload in (SessionCompleted, SessionFailed, SessionCancelled)
)
"""The types of the events that end a session: what comes before one is settled history
(whatever follows, say a rollback, comes after it)."""


def jetstream_streams() -> tuple[str, ...]:
    """Names of the JetStream streams behind Helmline's streams, buckets and object stores."""
    return (
        *(stream.name for stream in STREAMS),
        *(f"KV_{bucket.bucket}" for bucket in KEY_VALUE_BUCKETS),
        *(f"OBJ_{store.bucket}" for store in OBJECT_STORES),
    )


def nats_permissions(service: str) -> NatsPermissions:
    """The NATS publish permissions of a service's own user."""
    if service not in SERVICES:
        raise ValueError(f"unknown service {service!r}; known: {', '.join(SERVICES)}")
    jetstream = ["$JS.API.INFO", "$JS.API.STREAM.NAMES"]
    for stream in jetstream_streams():
        jetstream += [
            f"$JS.API.STREAM.{action}.{stream}" for action in ("INFO", "CREATE", "UPDATE")
        ]
        jetstream += [
            f"$JS.API.STREAM.MSG.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}.>",
            f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.INFO.{stream}.>",
            f"$JS.API.CONSUMER.DELETE.{stream}.>",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
            f"$JS.ACK.{stream}.>",
            f"$JS.FC.{stream}.>",
        ]
    for bucket in KEY_VALUE_BUCKETS:
        if service in BUCKET_WRITERS[bucket.bucket]:
            jetstream.append(f"$KV.{bucket.bucket}.>")
    for store in OBJECT_STORES:
        if service in BUCKET_WRITERS[store.bucket]:
            # Deleting an object purges its chunks.
            jetstream += [f"$O.{store.bucket}.>", f"$JS.API.STREAM.PURGE.OBJ_{store.bucket}"]
    return NatsPermissions(
        publish_allow=(
            *(event_type_filter(payload.TYPE) for payload in published_by(service)),
            *(subject for subject, owners in SUBJECT_PUBLISHERS.items() if service in owners),
            *(dead_letter_subject(name) for name in SERVICE_CONSUMER_NAMES[service]),
            *jetstream,
            "_INBOX.>",
        )
    )


def nats_permissions_table() -> dict[str, list[str]]:
    """Every service's allowed publish subjects, as the Helm chart keeps them
    (`deploy/helm/helmline/files/nats-permissions.json`, written by `helmline schema export`)."""
    return {service: list(nats_permissions(service).publish_allow) for service in SERVICES}
