"""A step whose call failed is retried once a retry may succeed, not at once: when its MCP
server's circuit breaker lets a probe pass (also when the planner is killed while it waits),
or when a rate limit frees a slot. Every service a process of its own, a real MCP server
that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from helmline.contracts import (
    Actor,
    Event,
    PlanStep,
    Playbook,
    StepRetryDeferred,
    StepScheduled,
    ToolCallFailed,
    ToolCircuitChanged,
    circuit_subject,
    decode_event,
    tenant_filter,
)
from helmline.runtime import EventStore, latest_tool_registry
from helmline.runtime.testing import ServiceProcesses, eventually, run_playbook

from .conftest import Helmline
from .mcp_servers import ROOT, federating_stack

HANGING_SERVER = ROOT / "services" / "tool-gateway" / "tests" / "mcp_test_server.py"
PERSON = Actor(id="ana")


@dataclass
class HangingServer:
    """The test MCP server, federated with a breaker that the first failure opens."""

    id: str
    state: Path
    """Where it counts calls; its calls hang while `hang` is there."""
    stack: ServiceProcesses
    opened: list[ToolCircuitChanged] = field(default_factory=list)

    @property
    def calls(self) -> int:
        log = self.state / "calls-hang.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def playbook(self) -> Playbook:
        return Playbook(goal="ask", steps=(PlanStep(id="ask", tool=f"{self.id}__hang"),))


@asynccontextmanager
async def hanging_server(
    nats_url: str, js: JetStreamContext, folder: Path, *, reset_s: float
) -> AsyncIterator[HangingServer]:
    """Every service, the gateway federating a server whose calls hang (time out) until its
    breaker opens; from then on it would answer a probe."""
    server_id = f"hangs{uuid.uuid4().hex[:6]}"
    state = folder / "server-state"
    (folder / "stack").mkdir()
    state.mkdir()
    (state / "hang").touch()
    config = {
        "id": server_id,
        "stdio": {"command": sys.executable, "args": [str(HANGING_SERVER), str(state)]},
        "sandbox": {"write": [str(state)]},
        "risk": "low",
        "retries": 0,
        "timeout_s": 0.5,
        "circuit": {"failures": 1, "reset_s": reset_s},
        # A timed-out call may have taken effect: only a tool that may run twice is retried.
        "tools": {"hang": {"idempotent": True}},
    }
    with federating_stack(nats_url, folder / "stack", [config]) as stack:
        server = HangingServer(server_id, state, stack)

        async def circuit(message: Msg) -> None:
            change = decode_event(message.data).data
            if isinstance(change, ToolCircuitChanged) and change.state == "open":
                server.opened.append(change)
                (state / "hang").unlink(missing_ok=True)

        subscription = await js._nc.subscribe(circuit_subject(server_id), cb=circuit)
        try:

            async def federated() -> bool:
                registry = await latest_tool_registry(js)
                return registry is not None and any(
                    s.server == server_id and s.available for s in registry.servers
                )

            await eventually(federated, timeout_s=60, what=f"MCP server {server_id} federated")
            yield server
        finally:
            await subscription.unsubscribe()


async def assert_retried_past_the_reset_window(
    store: EventStore, tenant: str, session_id: str, server: HangingServer
) -> None:
    events: list[Event] = [stored.event for stored in await store.read_all(tenant, session_id)]
    state = (await store.load(tenant, session_id)).state
    assert state.status == "completed", [(e.type, e.time, e.data) for e in events]
    (change,) = server.opened
    assert change.retry_at is not None
    # No failure was retried before a probe could pass: the attempt that succeeded is the
    # first one scheduled after the reset window.
    failures = [e for e in events if isinstance(e.data, ToolCallFailed)]
    assert failures
    assert all(f.data.error.retryable for f in failures)
    attempts = [e for e in events if isinstance(e.data, StepScheduled)]
    assert len(attempts) == len(failures) + 1 <= 3
    assert attempts[-1].time >= change.retry_at
    assert all(attempt.time < change.retry_at for attempt in attempts[:-1])
    # The failure before the last attempt was put off, and that wait recorded (an earlier one
    # may have been retried at once: before the planner heard of the open breaker).
    waits = [e.data for e in events if isinstance(e.data, StepRetryDeferred)]
    assert waits
    assert waits[-1].call_id == failures[-1].data.call_id
    assert all(w.retry_at == change.retry_at for w in waits)
    # The server got the first call, which hung, and the probe; nothing in between.
    assert server.calls == 2


async def test_a_step_failing_on_an_open_circuit_is_retried_when_a_probe_may_pass(
    nats_url: str, js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    async with hanging_server(nats_url, js, tmp_path, reset_s=3.0) as server:
        session_id = await run_playbook(store, tenant, server.playbook(), PERSON)

    await assert_retried_past_the_reset_window(store, tenant, session_id, server)


async def test_a_retry_waiting_for_the_circuit_survives_a_planner_killed_meanwhile(
    nats_url: str,
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
    tmp_path: Path,
    helmline: Helmline,
) -> None:
    async with hanging_server(nats_url, js, tmp_path, reset_s=10.0) as server:
        session = asyncio.create_task(run_playbook(store, tenant, server.playbook(), PERSON))

        async def deferred() -> Event | None:
            events = [stored.event for stored in await store.read_matching(tenant_filter(tenant))]
            return next((e for e in events if isinstance(e.data, StepRetryDeferred)), None)

        wait: Event = await eventually(deferred, what="the step's retry put off")
        assert isinstance(wait.data, StepRetryDeferred)
        (opened,) = server.opened
        assert wait.data.retry_at == opened.retry_at
        session_id = wait.session_id
        # Meanwhile a person sees when the step is tried again, and why it waits.
        code, shown, _ = await helmline("show", session_id, "--tenant", tenant)
        assert code == 0
        assert f"tried again at {wait.data.retry_at.astimezone():%Y-%m-%d %H:%M:%S}" in shown
        assert "circuit" in shown
        # Killed while the failure waits for the breaker to let a probe through: the retry
        # is still scheduled once, after the reset window, by the planner started again.
        await asyncio.to_thread(server.stack.kill, "planner")
        await asyncio.to_thread(server.stack.start, "planner")
        assert await session == session_id

    await assert_retried_past_the_reset_window(store, tenant, session_id, server)


async def test_a_rate_limited_step_is_retried_when_a_slot_frees(
    nats_url: str, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    server_id = f"limited{uuid.uuid4().hex[:6]}"
    state = tmp_path / "server-state"
    state.mkdir()
    config = {
        "id": server_id,
        "stdio": {"command": sys.executable, "args": [str(HANGING_SERVER), str(state)]},
        "sandbox": {"write": [str(state)]},
        "risk": "low",
        # A window the second step, scheduled as soon as the first ends, falls in even on a
        # loaded machine.
        "rate_limit": {"calls": 1, "per_s": 4},
    }
    note = f"{server_id}__note"
    playbook = Playbook(
        goal="two notes",
        steps=(
            PlanStep(id="first", tool=note, arguments={"message": "1"}),
            PlanStep(id="second", tool=note, arguments={"message": "2"}, depends_on=("first",)),
        ),
    )
    (tmp_path / "stack").mkdir()
    with federating_stack(nats_url, tmp_path / "stack", [config]):
        session_id = await run_playbook(store, tenant, playbook, PERSON)

    events = [stored.event for stored in await store.read_all(tenant, session_id)]
    state_now = (await store.load(tenant, session_id)).state
    assert state_now.status == "completed", [(e.type, e.data) for e in events]
    # The second step came within the first one's window: refused, with the time a slot
    # frees; its retry was put off until then, and then let through.
    (refused,) = [e for e in events if isinstance(e.data, ToolCallFailed)]
    assert refused.data.step_id == "second"
    assert refused.data.error.kind == "rate_limited"
    assert refused.data.retry_at is not None
    (wait,) = [e.data for e in events if isinstance(e.data, StepRetryDeferred)]
    assert (wait.call_id, wait.retry_at) == (refused.data.call_id, refused.data.retry_at)
    assert "limited to 1 calls per 4 s" in wait.reason
    second = [e for e in events if isinstance(e.data, StepScheduled) and e.data.step_id == "second"]
    assert [s.data.attempt for s in second] == [1, 2]
    assert second[-1].time >= refused.data.retry_at
    # Two calls reached the server: the refused one never did.
    assert len((state / "calls-note.log").read_text().splitlines()) == 2
