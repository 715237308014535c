"""Prometheus metrics of a service, derived from the events it records and handles.

Every service gets the same figures without code of its own: how its consumers fare (events
handled, handler time, lag, dead letters) and the figures operators ask for (sessions, steps,
tool calls, approvals, denials, sandbox use, checkpoints, rollbacks). The latter come from two
tables from event type to metric below:

- `_ON_APPEND`: a fact is counted once, by the process that records it (an append that
  JetStream drops as a duplicate is not counted again).
- `_ON_HANDLE`: an intent from outside (a session started by the CLI or the API) is counted by
  the consumer that subscribes to its type by name, since its appender may have no `/metrics`.

A new event type that should show on a dashboard needs one line in a table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from helmline.contracts import (
    BUILTIN_SERVER,
    OPEN_STATUSES,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    CheckpointCreated,
    ConsumerSpec,
    Event,
    LoopDetected,
    ModelExchangeRecorded,
    Payload,
    PermissionRequested,
    PlanProposed,
    ResourceUsage,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    SandboxLimitApproached,
    SandboxLimitExceeded,
    SessionCancelled,
    SessionCompleted,
    SessionFailed,
    SessionStarted,
    StepAuthorized,
    StepScheduled,
    StepSkipped,
    ToolCallAttemptFailed,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolCallStarted,
    ToolCircuitChanged,
    ToolServerHealthChanged,
    WorkspaceSnapshotted,
    event_type_filter,
)
from helmline.runtime._phases import PHASE_BUCKETS_S, PHASES, Hop

NAMESPACE = "helmline"
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
BYTES_BUCKETS = tuple(float(4**power) * 1024 for power in range(1, 12))
REMEMBERED = 10_000
"""Start times kept per kind (sessions, steps, approvals) to measure durations; those used
longest ago are dropped."""


class ServiceMetrics:
    """The Prometheus registry of one service and the observations that feed it."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        registry = self.registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, namespace=NAMESPACE, registry=registry)

        def histogram(
            name: str,
            doc: str,
            labels: tuple[str, ...] = (),
            buckets: tuple[float, ...] = DURATION_BUCKETS_S,
        ) -> Histogram:
            return Histogram(
                name, doc, labels, namespace=NAMESPACE, registry=registry, buckets=buckets
            )

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, namespace=NAMESPACE, registry=registry)

        # The bus
        self.events_appended = counter(
            "events_appended", "Events this service appended.", ("type",)
        )
        self.events_handled = counter(
            "events_handled",
            "Events handled, by how handling ended.",
            ("consumer", "type", "outcome"),
        )
        self.events_skipped = counter(
            "events_skipped",
            "Events a consumer was handed of a type its service does not handle (a newer "
            "producer's, during an upgrade): acknowledged and skipped.",
            ("consumer", "type"),
        )
        self.handler_seconds = histogram(
            "handler_duration_seconds", "Time a handler took per event.", ("consumer",)
        )
        self.hop_phase_seconds = histogram(
            "hop_phase_seconds",
            "Time one handled event spent in each phase of its hop, from its append to the "
            "ack of its delivery (helmline.runtime._phases says where each is measured).",
            ("consumer", "phase"),
            buckets=PHASE_BUCKETS_S,
        )
        self._hop_phases: dict[str, list[tuple[str, Histogram]]] = {}
        self.consumer_pending = gauge(
            "consumer_pending_messages",
            "Messages not yet delivered to a consumer (its lag).",
            ("consumer",),
        )
        self.consumer_ack_pending = gauge(
            "consumer_ack_pending_messages",
            "Messages delivered and not yet acknowledged.",
            ("consumer",),
        )
        self.dead_letters = counter(
            "dead_letters", "Messages parked in the dead-letter stream.", ("consumer", "reason")
        )
        # Sessions
        self.sessions_started = counter("sessions_started", "Sessions started.", ("mode",))
        self.sessions_ended = counter("sessions_ended", "Sessions ended, by outcome.", ("outcome",))
        self.sessions_active = gauge(
            "sessions_active", "Sessions this replica saw start and not yet end."
        )
        self.sessions_open = gauge(
            "sessions_open",
            "Sessions of the whole stack not ended yet, by status, as the state service's "
            "read model counts them (the same in every replica: take the max, not the sum).",
            ("status",),
        )
        self.session_seconds = histogram(
            "session_duration_seconds", "Time from a session's start to its end.", ("outcome",)
        )
        # Plans and steps
        self.plans_proposed = counter("plans_proposed", "Plans proposed (first and revised).")
        self.replans = counter("replans", "Revised plans (revision 2 and later).")
        self.plan_seconds = histogram(
            "plan_generation_seconds", "Time from a session's start to its first plan."
        )
        self.steps_scheduled = counter("steps_scheduled", "Steps scheduled.", ("tool",))
        self.steps_skipped = counter("steps_skipped", "Steps skipped.")
        self.step_seconds = histogram(
            "step_duration_seconds",
            "Time from scheduling a step to its tool call's end, by how the call ended "
            "(succeeded, failed or denied): their counts give the steps' success rate.",
            ("tool", "outcome"),
        )
        # Tool calls
        self.tool_calls = counter(
            "tool_calls", "Tool calls ended, by status.", ("tool", "server", "status")
        )
        self.tool_call_seconds = histogram(
            "tool_call_duration_seconds", "Time a tool call ran.", ("tool", "server")
        )
        self.denials = counter(
            "permission_denials", "Tool calls denied by policy or people.", ("tool",)
        )
        self.tool_call_retries = counter(
            "tool_call_retries",
            "Tool call attempts that failed and were retried.",
            ("tool", "kind"),
        )
        self.breaker_state = gauge(
            "circuit_breaker_state",
            "State of an MCP server's circuit breaker: 0 closed, 1 half open, 2 open.",
            ("server",),
        )
        self.breaker_changes = counter(
            "circuit_breaker_changes", "Circuit breaker state changes.", ("server", "state")
        )
        self.mcp_server_health = gauge(
            "mcp_server_health",
            "Health of an MCP server in this gateway: 0 healthy, 1 degraded, 2 unresponsive, "
            "3 dead.",
            ("server",),
        )
        self.mcp_server_health_changes = counter(
            "mcp_server_health_changes",
            "Moves of an MCP server's health, by the health it moved to.",
            ("server", "health"),
        )
        self.rate_limited = counter(
            "rate_limit_rejections", "Tool calls refused by a rate limit.", ("tool",)
        )
        # Approvals
        self.approval_requests = counter(
            "approval_requests", "Approvals asked of people.", ("scope", "risk")
        )
        self.approval_decisions = counter(
            "approval_decisions", "Approval requests decided or expired.", ("decision",)
        )
        self.approval_wait = histogram(
            "approval_wait_seconds", "Time an approval request waited for its decision."
        )
        self.approvals_waiting = gauge(
            "approvals_waiting",
            "Approval requests of the whole stack waiting for a person, as the state service's "
            "read model counts them (the same in every replica: take the max, not the sum).",
        )
        self.oldest_approval = gauge(
            "approval_oldest_waiting_seconds",
            "Age of the oldest approval request of the whole stack still waiting (read model).",
        )
        # Sandbox, checkpoints, rollbacks
        self.sandbox_cpu = histogram(
            "sandbox_cpu_seconds", "CPU time of a sandboxed command.", buckets=DURATION_BUCKETS_S
        )
        self.sandbox_memory = histogram(
            "sandbox_peak_memory_bytes",
            "Peak memory of a sandboxed command.",
            buckets=BYTES_BUCKETS,
        )
        self.sandbox_limits = counter(
            "sandbox_limit_hits", "Sandboxed commands stopped by a limit.", ("limit",)
        )
        self.checkpoints = counter("checkpoints", "Checkpoints recorded.", ("reversible",))
        self.snapshot_bytes = histogram(
            "workspace_snapshot_bytes",
            "Size of a checkpoint's workspace snapshot.",
            buckets=BYTES_BUCKETS,
        )
        self.rollbacks = counter("rollbacks", "Rollbacks ended, by outcome.", ("outcome",))
        self.sandbox_limit_warnings = counter(
            "sandbox_limit_warnings", "Sandboxed commands close to a limit.", ("limit",)
        )
        self.stream_limit_used = gauge(
            "stream_limit_used_ratio",
            "Share of a stream's retention limit in use (at 1 its oldest events are removed).",
            ("stream", "limit"),
        )
        # The model
        self.model_tokens = counter(
            "model_tokens", "Tokens models used.", ("provider", "model", "direction")
        )
        self.model_cost = counter(
            "model_cost_usd", "What model calls cost, in US dollars.", ("provider", "model")
        )
        self.model_seconds = histogram(
            "model_request_duration_seconds", "Time a model took to answer.", ("provider",)
        )
        self.loops = counter("loops_detected", "Sessions stopped repeating the same calls.")

        self._session_starts = _Clock()
        self._step_starts = _Clock()
        self._approval_asks = _Clock()
        self._call_servers: LRUCache[str, str] = LRUCache(REMEMBERED)
        self._oldest_waiting_since: datetime | None = None
        self.oldest_approval.set_function(self._oldest_waiting_s)

    def waiting(self, sessions: Mapping[str, int], approvals: int, oldest: datetime | None) -> None:
        """What the whole stack has not finished, counted in the read model: sessions not
        ended by status, approval requests waiting, and when the oldest of them was made."""
        for status in OPEN_STATUSES:
            self.sessions_open.labels(status).set(sessions.get(status, 0))
        self.approvals_waiting.set(approvals)
        self._oldest_waiting_since = oldest

    def _oldest_waiting_s(self) -> float:
        if self._oldest_waiting_since is None:
            return 0.0
        return max(0.0, time.time() - self._oldest_waiting_since.timestamp())

    def appended(self, event: Event, duplicate: bool) -> None:
        """An event this service appended (`duplicate`: JetStream had it already)."""
        if duplicate:
            return
        self.events_appended.labels(event.type).inc()
        observe = _ON_APPEND.get(type(event.data))
        if observe is not None:
            observe(self, event)

    def handled(self, consumer: ConsumerSpec, event: Event, outcome: str, seconds: float) -> None:
        """A consumer's handler ended (`ok`, `deferred`, `retry` or `dead_letter`) after
        `seconds`."""
        self.events_handled.labels(consumer.durable, event.type, outcome).inc()
        self.handler_seconds.labels(consumer.durable).observe(seconds)
        observe = _ON_HANDLE.get(type(event.data))
        if (
            outcome == "ok"
            and observe is not None
            and event_type_filter(event.type) in consumer.filter_subjects
            and (consumer.counts_sessions or not isinstance(event.data, SessionStarted))
        ):
            observe(self, event)

    def hop(self, consumer: ConsumerSpec, hop: Hop) -> None:
        """A consumer's handler ended well: where the hop's time went."""
        children = self._hop_phases.get(consumer.durable)
        if children is None:
            children = [
                (phase, self.hop_phase_seconds.labels(consumer.durable, phase)) for phase in PHASES
            ]
            self._hop_phases[consumer.durable] = children
        phases = hop.phases_ns()
        for phase, child in children:
            child.observe(phases[phase] / 1e9)

    # Observers: each takes the event whose type the tables map to it.

    def _session_started(self, event: Event) -> None:
        assert isinstance(event.data, SessionStarted)
        self.sessions_started.labels(event.data.mode).inc()
        self.sessions_active.inc()
        self._session_starts.start(_session_key(event), event.time)

    def _session_ended(self, event: Event) -> None:
        outcome = event.type.removeprefix("session.")
        self.sessions_ended.labels(outcome).inc()
        began = self._session_starts.stop(_session_key(event))
        if began is not None:
            self.sessions_active.dec()
            self.session_seconds.labels(outcome).observe(_seconds(began, event.time))

    def _plan_proposed(self, event: Event) -> None:
        assert isinstance(event.data, PlanProposed)
        self.plans_proposed.inc()
        if event.data.revision > 1:
            self.replans.inc()
            return
        began = self._session_starts.peek(_session_key(event))
        if began is not None:
            self.plan_seconds.observe(_seconds(began, event.time))

    def _step_scheduled(self, event: Event) -> None:
        assert isinstance(event.data, StepScheduled)
        self.steps_scheduled.labels(event.data.tool).inc()
        self._step_starts.start(_call_key(event, event.data.call_id), event.time)

    def _step_skipped(self, event: Event) -> None:
        self.steps_skipped.inc()

    def _step_ended(self, event: Event) -> None:
        assert isinstance(event.data, ToolCallCompleted | ToolCallFailed | ToolCallDenied)
        began = self._step_starts.stop(_call_key(event, event.data.call_id))
        if began is not None:
            outcome = _STEP_OUTCOMES[type(event.data)]
            self.step_seconds.labels(event.data.tool, outcome).observe(_seconds(began, event.time))

    def _tool_call_started(self, event: Event) -> None:
        assert isinstance(event.data, ToolCallStarted)
        self._call_servers[_call_key(event, event.data.call_id)] = event.data.server

    def _tool_call_ended(self, event: Event) -> None:
        assert isinstance(event.data, ToolCallCompleted | ToolCallFailed)
        call = event.data
        # The server is named where the call started, in this same process.
        server = self._call_servers.pop(_call_key(event, call.call_id), BUILTIN_SERVER)
        status = "completed" if isinstance(call, ToolCallCompleted) else call.error.kind
        self.tool_calls.labels(call.tool, server, status).inc()
        self.tool_call_seconds.labels(call.tool, server).observe(call.duration_ms / 1000)
        if isinstance(call, ToolCallFailed) and call.error.kind == "rate_limited":
            self.rate_limited.labels(call.tool).inc()
        if call.usage is not None:
            self._sandbox_usage(call.usage)

    def _tool_call_retried(self, event: Event) -> None:
        assert isinstance(event.data, ToolCallAttemptFailed)
        self.tool_call_retries.labels(event.data.tool, event.data.error.kind).inc()

    def _circuit_changed(self, event: Event) -> None:
        assert isinstance(event.data, ToolCircuitChanged)
        state = {"closed": 0, "half_open": 1, "open": 2}[event.data.state]
        self.breaker_state.labels(event.data.server).set(state)
        self.breaker_changes.labels(event.data.server, event.data.state).inc()

    def _server_health_changed(self, event: Event) -> None:
        assert isinstance(event.data, ToolServerHealthChanged)
        change = event.data
        self.mcp_server_health.labels(change.server).set(_HEALTH_LEVELS[change.health])
        self.mcp_server_health_changes.labels(change.server, change.health).inc()

    def _model_exchange(self, event: Event) -> None:
        assert isinstance(event.data, ModelExchangeRecorded)
        exchange = event.data
        provider, model = exchange.provider, exchange.request.model
        usage = exchange.reply.usage
        self.model_tokens.labels(provider, model, "input").inc(usage.input_tokens)
        self.model_tokens.labels(provider, model, "output").inc(usage.output_tokens)
        if exchange.cost_usd is not None:
            self.model_cost.labels(provider, model).inc(exchange.cost_usd)
        self.model_seconds.labels(provider).observe(exchange.duration_ms / 1000)

    def _loop_detected(self, event: Event) -> None:
        self.loops.inc()

    def _sandbox_limit_approached(self, event: Event) -> None:
        assert isinstance(event.data, SandboxLimitApproached)
        self.sandbox_limit_warnings.labels(event.data.limit.limit).inc()

    def _tool_call_denied(self, event: Event) -> None:
        assert isinstance(event.data, ToolCallDenied)
        self.denials.labels(event.data.tool).inc()

    def _approval_requested(self, event: Event) -> None:
        assert isinstance(event.data, ApprovalRequested)
        self.approval_requests.labels(event.data.scope, event.data.risk).inc()
        self._approval_asks.start(_call_key(event, event.data.request_id), event.time)

    def _approval_decided(self, event: Event) -> None:
        assert isinstance(event.data, ApprovalGranted | ApprovalDenied | ApprovalExpired)
        self.approval_decisions.labels(event.type.removeprefix("approval.")).inc()
        asked = self._approval_asks.stop(_call_key(event, event.data.request_id))
        if asked is not None:
            self.approval_wait.observe(_seconds(asked, event.time))

    def _sandbox_limit(self, event: Event) -> None:
        assert isinstance(event.data, SandboxLimitExceeded)
        self.sandbox_limits.labels(event.data.hit.limit).inc()
        self._sandbox_usage(event.data.usage)

    def _sandbox_usage(self, usage: ResourceUsage) -> None:
        if usage.cpu_ms is not None:
            self.sandbox_cpu.observe(usage.cpu_ms / 1000)
        if usage.peak_memory_mb is not None:
            self.sandbox_memory.observe(usage.peak_memory_mb * 1024 * 1024)

    def _checkpoint(self, event: Event) -> None:
        assert isinstance(event.data, CheckpointCreated)
        self.checkpoints.labels(str(event.data.reversible).lower()).inc()

    def _snapshot(self, event: Event) -> None:
        assert isinstance(event.data, WorkspaceSnapshotted)
        self.snapshot_bytes.observe(event.data.bytes)

    def _rollback_ended(self, event: Event) -> None:
        self.rollbacks.labels(event.type.removeprefix("rollback.")).inc()


Observer = Callable[[ServiceMetrics, Event], None]

_HEALTH_LEVELS = {"healthy": 0, "degraded": 1, "unresponsive": 2, "dead": 3}


_ON_APPEND: dict[type[Payload], Observer] = {
    SessionCompleted: ServiceMetrics._session_ended,
    SessionFailed: ServiceMetrics._session_ended,
    SessionCancelled: ServiceMetrics._session_ended,
    PlanProposed: ServiceMetrics._plan_proposed,
    StepScheduled: ServiceMetrics._step_scheduled,
    StepAuthorized: ServiceMetrics._step_scheduled,
    StepSkipped: ServiceMetrics._step_skipped,
    ToolCallStarted: ServiceMetrics._tool_call_started,
    ToolCallCompleted: ServiceMetrics._tool_call_ended,
    ToolCallFailed: ServiceMetrics._tool_call_ended,
    ToolCallDenied: ServiceMetrics._tool_call_denied,
    ApprovalRequested: ServiceMetrics._approval_requested,
    PermissionRequested: ServiceMetrics._approval_requested,
    ApprovalGranted: ServiceMetrics._approval_decided,
    ApprovalDenied: ServiceMetrics._approval_decided,
    ApprovalExpired: ServiceMetrics._approval_decided,
    SandboxLimitExceeded: ServiceMetrics._sandbox_limit,
    SandboxLimitApproached: ServiceMetrics._sandbox_limit_approached,
    ToolCallAttemptFailed: ServiceMetrics._tool_call_retried,
    ToolCircuitChanged: ServiceMetrics._circuit_changed,
    ToolServerHealthChanged: ServiceMetrics._server_health_changed,
    ModelExchangeRecorded: ServiceMetrics._model_exchange,
    LoopDetected: ServiceMetrics._loop_detected,
    CheckpointCreated: ServiceMetrics._checkpoint,
    WorkspaceSnapshotted: ServiceMetrics._snapshot,
    RollbackCompleted: ServiceMetrics._rollback_ended,
    RollbackFailed: ServiceMetrics._rollback_ended,
    RollbackRefused: ServiceMetrics._rollback_ended,
}
"""Facts, observed by the process that appends them."""

_ON_HANDLE: dict[type[Payload], Observer] = {
    SessionStarted: ServiceMetrics._session_started,
    # A step ends where it was scheduled from: the planner hears how its tool call ended.
    ToolCallCompleted: ServiceMetrics._step_ended,
    ToolCallFailed: ServiceMetrics._step_ended,
    ToolCallDenied: ServiceMetrics._step_ended,
}
"""Observed by a consumer that subscribes to the type by name, once handled (a session's
start only by the consumer that counts sessions: the sandbox hears it too, for forks, but
never sees a session end)."""


_STEP_OUTCOMES: dict[type[Payload], str] = {
    ToolCallCompleted: "succeeded",
    ToolCallFailed: "failed",
    ToolCallDenied: "denied",
}


class _Clock:
    """When things started, by key, bounded: those used longest ago are forgotten first."""

    def __init__(self) -> None:
        self._starts: LRUCache[str, datetime] = LRUCache(REMEMBERED)

    def start(self, key: str, at: datetime) -> None:
        self._starts[key] = at

    def peek(self, key: str) -> datetime | None:
        return self._starts.get(key)

    def stop(self, key: str) -> datetime | None:
        return self._starts.pop(key, None)


def _session_key(event: Event) -> str:
    return f"{event.tenant}/{event.session_id}"


def _call_key(event: Event, call_id: str) -> str:
    return f"{event.tenant}/{event.session_id}/{call_id}"


def _seconds(began: datetime, ended: datetime) -> float:
    return max(0.0, (ended - began).total_seconds())
