"""Watching stdio MCP servers: the test server's process (mcp_test_server.py) killed with
SIGKILL under a real gateway is marked dead at once, its call in flight ends as its tool's
declaration says, and it is started anew with growing pauses."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    ToolCallAttemptFailed,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    ToolServerHealthChanged,
    decode_event,
    server_health_subject,
)
from helmline.runtime import latest_tool_registry
from helmline.runtime.testing import eventually

# Not a package, so mypy cannot follow; pytest imports it all the same.
from .conftest import (  # type: ignore[import-not-found]
    Calls,
    calls_received,
    federated,
    gateway_in_process,
    server_pid,
    write_servers_file,
)

pytestmark = pytest.mark.usefixtures("drop_consumer")

# Heartbeats too far apart to notice anything within a test: whatever the gateway notices,
# it notices by watching the process.
NO_HEARTBEAT = {"interval_s": 600, "timeout_s": 5, "misses": 2}


class HealthChanges:
    """The `tool.server.health_changed` events of one server, as they are published."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ToolServerHealthChanged]] = []

    async def received(self, message: Any) -> None:
        event = decode_event(message.data)
        assert isinstance(event.data, ToolServerHealthChanged)
        self.seen.append((event.time, event.data))

    @property
    def healths(self) -> list[str]:
        return [change.health for _, change in self.seen]

    async def until(self, *healths: str) -> None:
        await eventually(
            lambda: self.healths == list(healths), timeout_s=30, what=f"health {healths}"
        )


@pytest.fixture
async def health(js: JetStreamContext, server_id: str) -> AsyncIterator[HealthChanges]:
    changes = HealthChanges()
    subscription = await js._nc.subscribe(server_health_subject(server_id), cb=changes.received)
    yield changes
    await subscription.unsubscribe()


async def restarted(state_dir: Path, killed: int) -> int:
    """The pid of the server process started after `killed`."""
    pid: int = await eventually(
        lambda: (pid := server_pid(state_dir)) not in (0, killed) and pid,
        timeout_s=30,
        what="a new server process",
    )
    return pid


async def test_a_killed_stdio_server_is_dead_at_once_and_started_anew_after_growing_pauses(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    health: HealthChanges,
) -> None:
    servers = write_servers_file(
        tmp_path / "servers.yaml", server_id, state_dir, heartbeat=NO_HEARTBEAT
    )
    async with gateway_in_process(nats_url, servers, tenant) as host:
        await federated(js, server_id)
        await health.until("healthy")
        topic = f"MCP server {server_id}"
        assert host.about[topic].startswith("healthy (stdio, ")

        first = server_pid(state_dir)
        os.kill(first, signal.SIGKILL)
        await health.until("healthy", "dead")
        _, dead = health.seen[1]
        assert (dead.previous, dead.reason, dead.restarts) == ("healthy", "its process exited", 0)
        assert dead.transport == "stdio"
        assert dead.gateway.endswith(f"/{os.getpid()}")
        # What `/readyz` answers, and so `helmline status` shows, follows at once.
        assert host.about[topic].startswith("dead (stdio, ")
        assert ": its process exited" in host.about[topic]
        assert "next try at" in host.about[topic]

        async def listed_dead() -> bool:
            registry = await latest_tool_registry(js)
            # Dead, its tools stay known: a call made while it restarts waits for it.
            return registry is not None and any(
                (s.server, s.available, s.health) == (server_id, False, "dead") and s.tools > 0
                for s in registry.servers
            )

        await eventually(listed_dead, what="the registry listing the server as dead")

        second = await restarted(state_dir, first)
        await health.until("healthy", "dead", "healthy")
        assert health.seen[2][1].restarts == 1
        assert host.about[topic].startswith("healthy (stdio, ")

        # Killed again soon after it came back, it is started after a longer pause.
        os.kill(second, signal.SIGKILL)
        await health.until("healthy", "dead", "healthy", "dead")
        await restarted(state_dir, second)
        await health.until("healthy", "dead", "healthy", "dead", "healthy")
        pauses = []
        for at, change in (health.seen[1], health.seen[3]):
            assert change.retry_at is not None
            pauses.append((change.retry_at - at).total_seconds())
        assert 0.3 < pauses[0] < 0.8, pauses
        assert 0.8 < pauses[1] < 1.3, pauses
        assert health.seen[4][1].restarts == 2
        # The gateway's metrics saw each move: once its append of the last one is
        # acknowledged, which may come after this test heard of it.
        sample = host.metrics.registry.get_sample_value
        moved_dead = {"server": server_id, "health": "dead"}

        def counted() -> bool:
            healthy = sample("helmline_mcp_server_health", {"server": server_id}) == 0
            deaths = sample("helmline_mcp_server_health_changes_total", moved_dead)
            return bool(healthy and deaths == 2)

        await eventually(counted, what="the health metrics")

        outcome = await calls.outcome(await calls.authorise(f"{server_id}__note", message="up"))
        assert isinstance(outcome, ToolCallCompleted), outcome
        assert calls_received(state_dir, "note") == 1


@pytest.mark.parametrize(
    ("declared", "resent"),
    [({"idempotent": True}, True), ({"action": "read"}, True), ({}, False)],
    ids=["idempotent", "read-only", "undeclared"],
)
async def test_a_call_in_flight_when_its_stdio_server_is_killed_is_sent_again_only_if_it_may_be(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    health: HealthChanges,
    declared: dict[str, object],
    resent: bool,
) -> None:
    (state_dir / "hang").touch()
    servers = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        heartbeat=NO_HEARTBEAT,
        timeout_s=20,
        tools={"hang": declared},
    )
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        call_id = await calls.authorise(f"{server_id}__hang")

        async def in_flight() -> bool:
            sent = calls_received(state_dir, "hang") == 1
            return sent and any(isinstance(e, ToolCallStarted) for e in await calls.events(call_id))

        await eventually(in_flight, timeout_s=30, what="the call in flight")
        killed = server_pid(state_dir)
        os.kill(killed, signal.SIGKILL)
        # The server started anew answers at once.
        (state_dir / "hang").unlink()
        outcome = await calls.outcome(call_id)
        await restarted(state_dir, killed)
        # Dead before the call heard of it; back, the call's failure still counts against it
        # (a server its calls crash must open its breaker) until a call succeeds.
        await health.until("healthy", "dead", "degraded", *(["healthy"] if resent else []))
        assert health.seen[2][1].reason == "failed calls in a row: 1"
        if resent:
            assert isinstance(outcome, ToolCallCompleted), outcome
            assert (outcome.output, outcome.attempts) == ({"result": "answered"}, 2)
            (lost,) = [
                e for e in await calls.events(call_id) if isinstance(e, ToolCallAttemptFailed)
            ]
            assert lost.error.kind == "unavailable"
            assert "its process exited with the call in flight" in lost.error.message
            assert calls_received(state_dir, "hang") == 2
            return
        assert isinstance(outcome, ToolCallFailed), outcome
        assert (outcome.error.kind, outcome.error.retryable) == ("unknown_outcome", False)
        assert "its process exited with the call in flight" in outcome.error.message
        assert outcome.error.suggestion
        assert calls_received(state_dir, "hang") == 1
        # The server is back for the calls that follow.
        later = await calls.outcome(await calls.authorise(f"{server_id}__note", message="next"))
        assert isinstance(later, ToolCallCompleted), later
        await health.until("healthy", "dead", "degraded", "healthy")
