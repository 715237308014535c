"""The tool gateway under test: in this process or as replica processes, federating the
test MCP server (mcp_test_server.py) and the real ones; calls are authorised directly."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from nats.js import JetStreamContext

from helmline.contracts import (
    EVENTS_STREAM,
    TOOL_GATEWAY_CONSUMER,
    Actor,
    ConsumerSpec,
    Event,
    Payload,
    PlanApproved,
    Risk,
    StepAuthorization,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallFailed,
    ToolRegistryPublished,
    event_subject,
    event_type_filter,
    new_event,
    received_payloads,
)
from helmline.runtime import EventStore, ServiceHost, latest_tool_registry
from helmline.runtime.testing import ServiceProcesses, eventually, free_port
from helmline.tool_gateway import load_servers
from helmline.tool_gateway.__main__ import setup_gateway
from helmline.tool_gateway._settings import GatewaySettings
from helmline.tool_gateway.testing import http_mcp_server

HERE = Path(__file__).parent
TEST_SERVER = HERE / "mcp_test_server.py"
REPLICA = HERE / "gateway_replica.py"


@pytest.fixture
def server_id() -> str:
    """An MCP server id of this test's own, so registries of tests never get mixed up."""
    return f"s{uuid.uuid4().hex[:10]}"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """Where the test MCP server counts the calls it receives."""
    path = tmp_path / "server-state"
    path.mkdir()
    return path


@pytest.fixture
def http_server(state_dir: Path, tmp_path: Path) -> Iterator[str]:
    """The test MCP server over Streamable HTTP (see its docstring); its MCP URL."""
    port = free_port()
    argv = [sys.executable, str(TEST_SERVER), str(state_dir), str(port)]
    with http_mcp_server(argv, port, tmp_path / "http-server.log") as url:
        yield url


def write_servers_file(
    path: Path, server_id: str, state_dir: Path, *, http: str | None = None, **settings: Any
) -> Path:
    """An MCP servers file federating the test server as `server_id`, with `settings`: over
    stdio, or at the Streamable HTTP URL `http` (see the `http_server` fixture)."""
    # Over stdio it runs in its sandbox, writing what it counts to `state_dir`.
    transport = (
        {"http": {"url": http}}
        if http is not None
        else {
            "stdio": {"command": sys.executable, "args": [str(TEST_SERVER), str(state_dir)]},
            "sandbox": {"write": [str(state_dir)]},
        }
    )
    server = {"id": server_id, **transport, "risk": "low", **settings}
    path.write_text(yaml.safe_dump({"servers": [server]}))
    return path


HANDLED = received_payloads(TOOL_GATEWAY_CONSUMER)
"""What the gateway runs calls on: authorised calls, and steps their plan authorised."""


def gateway_consumer(
    tenant: str, ack_wait_s: float = 30.0, session_id: str | None = None
) -> ConsumerSpec:
    """The gateway's consumer, for one tenant's calls only, or one session's."""
    if session_id is None:
        durable = f"gateway-{tenant}"
        calls = tuple(event_type_filter(kind.TYPE, tenant) for kind in HANDLED)
    else:
        durable = f"gateway-{tenant}-{session_id}"
        calls = tuple(event_subject(tenant, session_id, kind.TYPE) for kind in HANDLED)
    return TOOL_GATEWAY_CONSUMER.model_copy(
        update={"durable": durable, "filter_subjects": calls, "ack_wait_s": ack_wait_s}
    )


async def federated(js: JetStreamContext, server_id: str) -> ToolRegistryPublished:
    """The registry, once it lists `server_id` as available."""

    async def available() -> ToolRegistryPublished | None:
        registry = await latest_tool_registry(js)
        if registry is not None and any(
            s.server == server_id and s.available for s in registry.servers
        ):
            return registry
        return None

    registry: ToolRegistryPublished = await eventually(
        available, timeout_s=60, what=f"MCP server {server_id} federated"
    )
    return registry


@asynccontextmanager
async def gateway_in_process(
    nats_url: str, servers_file: Path, tenant: str, **settings: Any
) -> AsyncIterator[ServiceHost]:
    """The gateway in this process, consuming `tenant`'s calls."""
    gateway_settings = GatewaySettings(
        nats_url=nats_url, mcp_servers=servers_file, shutdown_grace_s=0, **settings
    )
    async with ServiceHost("tool-gateway", gateway_settings) as host:
        await setup_gateway(gateway_settings, load_servers(servers_file), gateway_consumer(tenant))(
            host
        )
        yield host


@pytest.fixture
def replicas(nats_url: str, tmp_path: Path) -> Iterator[ServiceProcesses]:
    """Gateway replicas as their own processes (started by the test)."""
    running = ServiceProcesses(nats_url, tmp_path)
    try:
        yield running
    finally:
        running.stop_all()


def start_replica(
    replicas: ServiceProcesses,
    name: str,
    servers_file: Path,
    tenant: str,
    ack_wait_s: float,
    session_id: str | None = None,
) -> None:
    """Start (or restart) one gateway replica process, sharing the tenant's calls with the
    other replicas, or consuming only `session_id`'s calls."""
    only_session = {"TEST_SESSION": session_id} if session_id else {}
    replicas.start(
        name,
        {
            "HELMLINE_MCP_SERVERS": str(servers_file),
            "TEST_TENANT": tenant,
            "TEST_ACK_WAIT_S": str(ack_wait_s),
            **only_session,
        },
        script=REPLICA,
    )


class Calls:
    """Authorises calls in a session of its own, as the approval service would, and reads
    what the gateway recorded for them."""

    def __init__(self, store: EventStore, tenant: str) -> None:
        self.store = store
        self.tenant = tenant
        self.session_id = uuid.uuid4().hex

    async def authorise(
        self, tool: str, *, risk: Risk = "low", step_id: str = "s1", **arguments: Any
    ) -> str:
        """Authorise a call; a call of a step other than the session's other calls' (`s1`)
        has a progress of its own in the session's state."""
        call_id = f"c{uuid.uuid4().hex[:12]}"
        await self.store.append(
            new_event(
                ToolCallAuthorized(
                    call_id=call_id, step_id=step_id, tool=tool, arguments=arguments, risk=risk
                ),
                tenant=self.tenant,
                session_id=self.session_id,
                source="test/approval",
            )
        )
        return call_id

    async def approve_plan(self, *authorized: StepAuthorization, revision: int = 1) -> None:
        """Record the approval of a plan revision that authorises these steps' calls."""
        approval = PlanApproved(
            revision=revision, approved_by=Actor(id="policy"), authorized_steps=authorized
        )
        await self.store.append(self._event(approval, "test/approval"))

    async def schedule(self, scheduled: StepScheduled) -> str:
        """Schedule a step as the planner would; its call id."""
        await self.store.append(self._event(scheduled, "test/planner"))
        return scheduled.call_id

    def _event(self, payload: Payload, source: str) -> Event:
        return new_event(payload, tenant=self.tenant, session_id=self.session_id, source=source)

    async def events(self, call_id: str) -> list[Payload]:
        return [
            stored.event.data
            for stored in await self.store.read_all(self.tenant, self.session_id)
            if getattr(stored.event.data, "call_id", None) == call_id
        ]

    async def outcome(
        self, call_id: str, timeout_s: float = 60
    ) -> ToolCallCompleted | ToolCallFailed:
        async def ended() -> ToolCallCompleted | ToolCallFailed | None:
            for data in await self.events(call_id):
                if isinstance(data, ToolCallCompleted | ToolCallFailed):
                    return data
            return None

        result: ToolCallCompleted | ToolCallFailed = await eventually(
            ended, timeout_s=timeout_s, what=f"the outcome of {call_id}"
        )
        return result


@pytest.fixture
def calls(store: EventStore, tenant: str) -> Calls:
    return Calls(store, tenant)


@pytest.fixture
async def drop_consumer(js: JetStreamContext, tenant: str) -> AsyncIterator[None]:
    """Removes the tenant's gateway consumers after the test."""
    yield
    for consumer in await js.consumers_info(EVENTS_STREAM.name):
        if consumer.name.startswith(gateway_consumer(tenant).durable):
            await js.delete_consumer(EVENTS_STREAM.name, consumer.name)


def host_pids(*argv: str) -> list[int]:
    """The host pids of the processes running `argv` after their interpreter (`python
    SCRIPT ARGS`), sandboxed or not: a sandboxed server sees another pid in its sandbox's
    pid namespace. Zombies are not counted: exited all the same."""
    return [
        int(process.pid)
        for process in psutil.process_iter(["cmdline", "status"])
        if (process.info["cmdline"] or [])[1:] == list(argv)
        and process.info["status"] != psutil.STATUS_ZOMBIE
    ]


def server_pid(state_dir: Path) -> int:
    """The host pid of the test server counting into `state_dir` (0 while none runs)."""
    pids = host_pids(str(TEST_SERVER), str(state_dir))
    return pids[0] if pids else 0


def calls_received(state_dir: Path, tool: str) -> int:
    """How many calls of `tool` the test MCP server received."""
    log = state_dir / f"calls-{tool}.log"
    return len(log.read_text().splitlines()) if log.exists() else 0
