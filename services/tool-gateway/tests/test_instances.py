"""Instances per session and tenant, and the caps on a server's calls, under a real gateway
with a real stdio MCP server that keeps state in its process (stateful_mcp_server.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.js import JetStreamContext

from helmline.contracts import (
    McpInstanceStarted,
    McpInstanceStopped,
    Payload,
    SessionCompleted,
    ToolCallAttemptFailed,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    decode_event,
    mcp_instance_subject,
    new_event,
)
from helmline.runtime import EventStore, ServiceHost
from helmline.runtime.testing import ServiceProcesses, eventually, free_port
from helmline.tool_gateway import load_servers
from helmline.tool_gateway.testing import http_mcp_server
from helmline.yamlfile import YamlFileError

# Not a package, so mypy cannot follow; pytest imports it all the same.
from .conftest import (  # type: ignore[import-not-found]
    TEST_SERVER,
    Calls,
    calls_received,
    federated,
    gateway_in_process,
    host_pids,
    start_replica,
    write_servers_file,
)

pytestmark = pytest.mark.usefixtures("drop_consumer")

STATEFUL_SERVER = Path(__file__).parent / "stateful_mcp_server.py"


def stateful_servers_file(path: Path, server_id: str, **settings: Any) -> Path:
    server = {
        "id": server_id,
        "stdio": {"command": sys.executable, "args": [str(STATEFUL_SERVER)]},
        "risk": "low",
        **settings,
    }
    path.write_text(yaml.safe_dump({"servers": [server]}))
    return path


class InstanceRecords:
    """The `mcp.instance.*` events of one server, as they are published."""

    def __init__(self) -> None:
        self.seen: list[Payload] = []

    async def received(self, message: Any) -> None:
        self.seen.append(decode_event(message.data).data)

    def of(self, kind: type[Payload], session_id: str | None) -> list[Any]:
        return [
            record
            for record in self.seen
            if isinstance(record, McpInstanceStarted | McpInstanceStopped)
            and isinstance(record, kind)
            and record.instance.session_id == session_id
        ]


@pytest.fixture
async def records(js: JetStreamContext, server_id: str) -> AsyncIterator[InstanceRecords]:
    seen = InstanceRecords()
    subject = mcp_instance_subject(server_id, "*", "*")
    subscription = await js._nc.subscribe(subject, cb=seen.received)
    yield seen
    await subscription.unsubscribe()


class Stateful:
    """The gateway in this process, federating the stateful server, and its sessions."""

    def __init__(
        self,
        nats_url: str,
        store: EventStore,
        tenant: str,
        server_id: str,
        servers_file: Path,
        records: InstanceRecords,
    ) -> None:
        self.nats_url = nats_url
        self.store = store
        self.tenant = tenant
        self.server_id = server_id
        self.servers_file = servers_file
        self.records = records

    @asynccontextmanager
    async def gateway(self, **settings: Any) -> AsyncIterator[ServiceHost]:
        """The gateway, federating the server with `settings`, once it lists the server."""
        stateful_servers_file(self.servers_file, self.server_id, **settings)
        async with gateway_in_process(self.nats_url, self.servers_file, self.tenant) as host:
            await federated(self.store.js, self.server_id)
            yield host

    def sessions(self) -> tuple[Calls, Calls]:
        return Calls(self.store, self.tenant), Calls(self.store, self.tenant)

    async def called(self, session: Calls, tool: str, **arguments: Any) -> Any:
        """The result of a call of the server's `tool` that completed."""
        call_id = await session.authorise(f"{self.server_id}__{tool}", **arguments)
        outcome = await session.outcome(call_id)
        assert isinstance(outcome, ToolCallCompleted), outcome
        output = outcome.output
        # Structured, under `result`.
        return output["result"] if isinstance(output, dict) else json.loads(str(output))

    async def end(self, session: Calls) -> None:
        await self.store.append(
            new_event(
                SessionCompleted(summary="done"),
                tenant=session.tenant,
                session_id=session.session_id,
                source="test/planner",
            )
        )

    async def stopped(self, session_id: str | None) -> list[McpInstanceStopped]:
        """The instance of a session (None: of the tenant) recorded as stopped."""
        stopped: list[McpInstanceStopped] = await eventually(
            lambda: self.records.of(McpInstanceStopped, session_id),
            timeout_s=30,
            what=f"the instance of {session_id or 'the tenant'} recorded as stopped",
        )
        return stopped


@pytest.fixture
def stateful(
    nats_url: str,
    store: EventStore,
    tenant: str,
    server_id: str,
    tmp_path: Path,
    records: InstanceRecords,
) -> Stateful:
    return Stateful(nats_url, store, tenant, server_id, tmp_path / "servers.yaml", records)


def server_processes() -> int:
    """How many processes of the stateful test server run on this host: the gateway's
    listing connection's (an isolated server's tools are listed once, on a connection no
    call goes to), and each instance's."""
    return len(host_pids(str(STATEFUL_SERVER)))


async def test_sessions_see_only_their_own_state_and_their_instance_stops_at_their_end(
    stateful: Stateful,
) -> None:
    ana, bob = stateful.sessions()
    async with stateful.gateway(isolation="session"):
        await stateful.called(ana, "remember", note="ana's")
        await stateful.called(bob, "remember", note="bob's")
        assert await stateful.called(ana, "recall") == ["ana's"]
        assert await stateful.called(bob, "recall") == ["bob's"]
        assert await stateful.called(ana, "identity") != await stateful.called(bob, "identity")
        assert server_processes() == 3  # Listing, ana's, bob's.

        (started,) = stateful.records.of(McpInstanceStarted, ana.session_id)
        about = started.instance
        assert (about.isolation, about.tenant, started.replaces) == ("session", ana.tenant, None)
        await stateful.end(ana)

        stopped = await stateful.stopped(ana.session_id)
        assert [(s.instance, s.reason, s.calls) for s in stopped] == [(about, "session_ended", 3)]
        await eventually(lambda: server_processes() == 2, timeout_s=10, what="ana's process gone")
        assert stateful.records.of(McpInstanceStopped, bob.session_id) == []
    # The gateway stopping stops the instances it still runs.
    await eventually(lambda: server_processes() == 0, timeout_s=10, what="bob's process gone")
    (bob_stopped,) = await stateful.stopped(bob.session_id)
    assert bob_stopped.reason == "gateway_stopping"


async def test_a_full_pool_fails_a_call_as_rate_limited_within_its_queue_timeout(
    stateful: Stateful,
) -> None:
    ana, bob = stateful.sessions()
    pool = {"max_instances": 1, "queue_timeout_s": 0.5, "idle_s": 600}
    async with stateful.gateway(isolation="session", pool=pool) as host:
        await stateful.called(ana, "remember", note="ana's")

        asked = datetime.now(UTC)
        call_id = await bob.authorise(f"{stateful.server_id}__remember", note="bob's")
        refused = await bob.outcome(call_id, timeout_s=10)
        assert isinstance(refused, ToolCallFailed), refused
        assert refused.error.kind == "rate_limited"
        assert refused.error.retryable
        assert "1 of 1 instances" in refused.error.message
        # Not sent, so never started; refused once the queue's wait was over, not later.
        assert not any(isinstance(e, ToolCallStarted) for e in await bob.events(call_id))
        stored = await stateful.store.read_all(bob.tenant, bob.session_id)
        refused_at = stored[-1].event.time
        assert timedelta(seconds=0.5) <= refused_at - asked < timedelta(seconds=5)
        # The only instance is idle: a place frees when its idle time is over.
        assert refused.retry_at is not None
        assert refused.retry_at - refused_at > timedelta(seconds=590)
        figures = host.metrics.registry
        by_server = {"server": stateful.server_id}
        assert (
            figures.get_sample_value(
                "helmline_mcp_calls_refused_total", {**by_server, "why": "waited"}
            )
            == 1
        )
        assert figures.get_sample_value("helmline_mcp_instances", by_server) == 1
        assert figures.get_sample_value("helmline_mcp_calls_queued", by_server) == 0
        # What `/readyz` answers, and so `helmline status` shows.
        instances = host.about[f"MCP server {stateful.server_id} instances"]
        assert instances == "1 running of at most 1 (one per session)"

        # Ana's session ends: its instance stops, and bob's next call gets one of its own.
        await stateful.end(ana)
        await stateful.stopped(ana.session_id)
        assert await stateful.called(bob, "recall") == []


async def test_a_tenants_instance_stops_when_idle(stateful: Stateful) -> None:
    ana, bob = stateful.sessions()
    async with stateful.gateway(isolation="tenant", pool={"idle_s": 0.5}):
        await stateful.called(ana, "remember", note="ana's")
        # Another session of the same tenant shares its instance.
        assert await stateful.called(bob, "recall") == ["ana's"]
        assert server_processes() == 2  # Listing, the tenant's.
        stopped = await stateful.stopped(None)
        assert [(s.reason, s.instance.tenant, s.calls) for s in stopped] == [
            ("idle", ana.tenant, 2)
        ]
        await eventually(lambda: server_processes() == 1, timeout_s=10, what="its process gone")
        # The next call starts another, which holds nothing of the first.
        assert await stateful.called(ana, "recall") == []


async def test_a_session_whose_replica_died_gets_an_instance_anew_naming_the_lost_one(
    stateful: Stateful, replicas: ServiceProcesses
) -> None:
    ana, _ = stateful.sessions()
    servers = stateful_servers_file(
        stateful.servers_file,
        stateful.server_id,
        isolation="session",
    )
    start_replica(replicas, "gateway", servers, stateful.tenant, ack_wait_s=3)
    await federated(stateful.store.js, stateful.server_id)
    await stateful.called(ana, "remember", note="ana's")
    assert server_processes() == 2  # The replica's listing, ana's.
    (lost,) = await eventually(
        lambda: stateful.records.of(McpInstanceStarted, ana.session_id),
        what="ana's instance recorded as started",
    )
    waiting = await ana.authorise(f"{stateful.server_id}__wait", step_id="s2", seconds=30)

    async def in_flight() -> bool:
        return any(isinstance(e, ToolCallStarted) for e in await ana.events(waiting))

    await eventually(in_flight, timeout_s=30, what="the waiting call in flight")
    replicas.kill("gateway")
    await eventually(lambda: server_processes() == 0, timeout_s=10, what="the lost instance gone")
    await asyncio.to_thread(start_replica, replicas, "gateway", servers, stateful.tenant, 3)

    # The call in flight may or may not have taken effect: reported so, not sent again.
    outcome = await ana.outcome(waiting, timeout_s=60)
    assert isinstance(outcome, ToolCallFailed), outcome
    assert outcome.error.kind == "unknown_outcome"
    # The session's next call starts an instance anew, which names the lost one; its state
    # was lost with it.
    assert await stateful.called(ana, "recall") == []
    started = await eventually(
        lambda: stateful.records.of(McpInstanceStarted, ana.session_id)[1:],
        what="ana's instance started anew",
    )
    assert [s.replaces for s in started] == [lost.instance.id]
    assert started[0].instance.gateway != lost.instance.gateway


async def test_a_sessions_calls_reach_its_one_instance_whichever_replica_takes_them(
    stateful: Stateful, replicas: ServiceProcesses
) -> None:
    ana, _ = stateful.sessions()
    servers = stateful_servers_file(stateful.servers_file, stateful.server_id, isolation="session")
    # Both replicas take the session's calls, each call from whichever the consumer hands it.
    for name in ("gateway-a", "gateway-b"):
        start_replica(replicas, name, servers, stateful.tenant, 3, session_id=ana.session_id)
    await federated(stateful.store.js, stateful.server_id)
    notes = [f"note {i}" for i in range(10)]
    for note in notes:
        await stateful.called(ana, "remember", note=note)
    assert await stateful.called(ana, "recall") == notes
    # One instance, started by the first replica handed a call; the other hands it its calls.
    (started,) = stateful.records.of(McpInstanceStarted, ana.session_id)
    assert started.replaces is None
    handed = [
        (replicas.data_dir / f"{name}.log").read_text().count("handed to instance")
        for name in ("gateway-a", "gateway-b")
    ]
    assert min(handed) == 0 < max(handed), handed
    # Whichever replica hears the session end, the instance stops.
    await stateful.end(ana)
    (stopped,) = await stateful.stopped(ana.session_id)
    assert (stopped.instance, stopped.reason, stopped.calls) == (
        started.instance,
        "session_ended",
        11,
    )


async def test_each_replica_makes_its_mcp_session_anew_after_an_http_server_restarts(
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    replicas: ServiceProcesses,
) -> None:
    port = free_port()
    argv = [sys.executable, str(TEST_SERVER), str(state_dir), str(port)]
    url = f"http://127.0.0.1:{port}/mcp"
    servers = write_servers_file(tmp_path / "servers.yaml", server_id, state_dir, http=url)
    # Each replica consumes one session's calls: both must make their MCP session anew.
    sessions = [Calls(store, tenant), Calls(store, tenant)]

    async def echoed(round: str) -> None:
        for replica, session in enumerate(sessions):
            call_id = await session.authorise(f"{server_id}__echo", message=f"{round} {replica}")
            outcome = await session.outcome(call_id, timeout_s=60)
            assert isinstance(outcome, ToolCallCompleted), outcome

    with http_mcp_server(argv, port, tmp_path / "http-server.log"):
        for replica, session in enumerate(sessions):
            start_replica(
                replicas, f"gateway-{replica}", servers, tenant, 3, session_id=session.session_id
            )
        await federated(js, server_id)
        await echoed("before")
    # The server is started again: the MCP sessions the replicas held are unknown to it.
    with http_mcp_server(argv, port, tmp_path / "http-server-again.log"):
        await echoed("after")


async def test_a_call_answered_404_for_a_forgotten_mcp_session_is_sent_on_a_new_one(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    http_server: str,
) -> None:
    servers = write_servers_file(tmp_path / "servers.yaml", server_id, state_dir, http=http_server)
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        # As a server answers a request naming an MCP session it no longer knows (it was
        # started again behind a balancer, or another replica of it took the request).
        (state_dir / "http-answer").write_text("404")
        call_id = await calls.authorise(f"{server_id}__note", message="again")
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallCompleted), outcome
        (refused,) = [
            e for e in await calls.events(call_id) if isinstance(e, ToolCallAttemptFailed)
        ]
        assert refused.error.kind == "unavailable"
        assert "404" in refused.error.message
        assert (calls_received(state_dir, "refused"), calls_received(state_dir, "note")) == (1, 1)


@pytest.mark.parametrize(
    ("server", "named"),
    [
        ({"isolation": "per-call"}, "isolation"),
        ({"pool": {"max_instances": 2}}, "max_instances"),
        ({"isolation": "session", "pool": {"calls_per_instance": 9, "max_calls": 8}}, "max_calls"),
        ({"isolation": "session", "pool": {"queue_timeout_s": 0}}, "queue_timeout_s"),
    ],
)
def test_isolation_and_pools_are_checked_at_load(
    tmp_path: Path, server: dict[str, Any], named: str
) -> None:
    path = stateful_servers_file(tmp_path / "servers.yaml", "notes", **server)
    with pytest.raises(YamlFileError, match=named):
        load_servers(path)
