"""One session seen the way operators see it: its trace, each service's metrics, its logs.

The services run as real processes, each as its own NATS user with only its own publish
permissions, exporting spans over OTLP/gRPC to a receiver this test starts (the OTLP
protobufs served by grpcio), as they would to a collector.
"""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from helmline.cli._nats import ADMIN, NatsUsers, write_nats_config
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalRequested,
    PlanStep,
    Playbook,
    SessionStarted,
    new_event,
)
from helmline.runtime import EventStore, connect_nats
from helmline.runtime.testing import NatsServer, ServiceProcesses, eventually, free_port

from .otlp import otlp_endpoint  # type: ignore[import-not-found]

SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
TRACED = {"helmline-planner", "helmline-approval", "helmline-tool-gateway"} | {
    "helmline-state",
    "helmline-sandbox",
}


class SpanReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace endpoint that keeps what it is sent: (service name, span) pairs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[str, dict[str, str], bytes]] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        attributes = {a.key: a.value.string_value for a in span.attributes}
                        self.spans.append((service, attributes, span.trace_id))
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_session(self, session_id: str) -> list[tuple[str, dict[str, str], bytes]]:
        with self.lock:
            return [s for s in self.spans if s[1].get("helmline.session_id") == session_id]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[SpanReceiver, int]]:
    spans = SpanReceiver()
    with otlp_endpoint(spans) as port:
        yield spans, port


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsUsers, int]]:
    """A nats-server of its own where each service is a user that may publish only its own
    event types, as `helmline up` and the Helm chart set it up."""
    folder = tmp_path_factory.mktemp("secured-nats")
    users, port, store = NatsUsers.generate(), free_port(), folder / "jetstream"
    store.mkdir()
    config = write_nats_config(folder / "nats.conf", store_dir=store, port=port, users=users)
    with NatsServer(store, port, config):
        yield users, port


@pytest.fixture(scope="module")
def traced_services(
    secured_nats: tuple[NatsUsers, int],
    tmp_path_factory: pytest.TempPathFactory,
    receiver: tuple[SpanReceiver, int],
) -> Iterator[ServiceProcesses]:
    users, port = secured_nats
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver[1]}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "HELMLINE_LOG_LEVEL": "DEBUG",
    }
    running = ServiceProcesses(users.url(port, ADMIN), tmp_path_factory.mktemp("traced"), env)
    try:
        for name in SERVICES:
            own_user = users.url(port, name.replace("_", "-"))
            running.start(name, env={"HELMLINE_NATS_URL": own_user})
        yield running
    finally:
        running.stop_all()


@pytest.fixture
async def secured_store(secured_nats: tuple[NatsUsers, int]) -> AsyncIterator[EventStore]:
    """The event log on that server, as the CLI sees it (the admin user)."""
    users, port = secured_nats
    connection = await connect_nats(users.url(port, ADMIN))
    try:
        yield EventStore(connection.jetstream())
    finally:
        await connection.close()


def _metrics(services: ServiceProcesses, name: str) -> dict[str, float]:
    """Every sample of a service's /metrics, parsed by the Prometheus client's parser."""
    url = f"http://127.0.0.1:{services.ports[name]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def _total(samples: dict[str, float], name: str) -> float:
    return sum(value for key, value in samples.items() if key.startswith(name + "{"))


async def test_a_session_is_one_trace_across_services_and_moves_every_services_metrics(
    traced_services: ServiceProcesses,
    receiver: tuple[SpanReceiver, int],
    secured_store: EventStore,
    tenant: str,
) -> None:
    store = secured_store
    spans, _ = receiver
    before = {name: _metrics(traced_services, name) for name in SERVICES}
    playbook = Playbook(
        goal="say something and write it down",
        steps=(
            PlanStep(id="say", tool="echo", arguments={"message": "hi"}),
            PlanStep(
                id="note",
                tool="write_file",
                arguments={"path": "note.txt", "content": "hi"},
                depends_on=("say",),
            ),
            # High risk: a person approves it, from outside any trace, as the CLI does.
            PlanStep(
                id="check",
                tool="run_command",
                arguments={"command": "cat note.txt"},
                depends_on=("note",),
            ),
        ),
    )
    session_id = uuid.uuid4().hex
    started = new_event(
        SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=Actor(id="ana")),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    await store.append(started)

    async def asked() -> str | None:
        for item in await store.read_all(tenant, session_id):
            if isinstance(item.event.data, ApprovalRequested):
                return item.event.data.request_id
        return None

    request_id = await eventually(asked, timeout_s=60, what="an approval request")
    decision = ApprovalDecisionSubmitted(
        request_id=request_id, decision="grant", decided_by=Actor(id="ana", roles=("approver",))
    )
    await store.append(new_event(decision, tenant=tenant, session_id=session_id, source="test"))

    async def ended() -> bool:
        state = (await store.load(tenant, session_id)).state
        return state.status in ("completed", "failed") and len(state.checkpoints) == 3

    await eventually(ended, timeout_s=60, what="the session completed with three checkpoints")
    state = (await store.load(tenant, session_id)).state
    assert state.status == "completed", state.outcome

    def every_service_reported() -> bool:
        reported = spans.of_session(session_id)
        handled = {attrs.get("helmline.event_type") for _, attrs, _ in reported}
        return {service for service, _, _ in reported} >= TRACED and decision.TYPE in handled

    await eventually(every_service_reported, timeout_s=30, what="spans from every service")
    session_spans = spans.of_session(session_id)
    assert started.traceparent is not None
    trace_id = bytes.fromhex(started.traceparent.split("-")[1])
    assert {span_trace for _, _, span_trace in session_spans} == {trace_id}
    tool_spans = [attrs for _, attrs, _ in session_spans if "helmline.tool" in attrs]
    assert {"echo", "write_file", "run_command"} <= {a["helmline.tool"] for a in tool_spans}
    assert all(attrs["helmline.tenant"] == tenant for _, attrs, _ in session_spans)

    after = {name: _metrics(traced_services, name) for name in SERVICES}
    for name in SERVICES:
        for counter in ("helmline_events_handled_total", "helmline_events_appended_total"):
            assert _total(after[name], counter) > _total(before[name], counter), (name, counter)
    moved = {
        "planner": ("helmline_sessions_started_total", "helmline_sessions_ended_total"),
        "approval": ("helmline_events_handled_total",),
        "tool_gateway": ("helmline_tool_calls_total",),
        "sandbox": ("helmline_tool_calls_total", "helmline_workspace_snapshot_bytes_count"),
        "state": ("helmline_checkpoints_total",),
    }
    for name, counters in moved.items():
        for counter in counters:
            assert _total(after[name], counter) > _total(before[name], counter), (name, counter)
    assert "helmline_consumer_pending_messages{consumer=helmline-planner}" in after["planner"]
    # The steps' success rate, by how their calls ended.
    succeeded = "helmline_step_duration_seconds_count{outcome=succeeded,tool=echo}"
    assert after["planner"][succeeded] > before["planner"].get(succeeded, 0)

    _assert_logs_name_the_session(traced_services.data_dir, session_id, tenant, trace_id.hex())


def _assert_logs_name_the_session(
    data_dir: Path, session_id: str, tenant: str, trace_id: str
) -> None:
    """Each service's log is JSON lines; those about the session carry its ids."""
    about_session = []
    for name in SERVICES:
        for line in (data_dir / f"{name}.log").read_text().splitlines():
            record = json.loads(line)
            assert {"time", "level", "message", "tenant", "session_id", "trace_id"} <= set(record)
            if record["session_id"] == session_id:
                about_session.append(record)
    assert about_session, "no log line about the session"
    assert all(r["tenant"] == tenant and r["trace_id"] == trace_id for r in about_session)
