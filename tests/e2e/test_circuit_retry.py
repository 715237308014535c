"""A step whose MCP server's circuit breaker opened is retried once a probe may pass, not
at once: every service a process of its own, a real MCP server that hangs on purpose."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from nats.js import JetStreamContext

from helmline.contracts import (
    Actor,
    PlanStep,
    Playbook,
    StepScheduled,
    ToolCallFailed,
    ToolCircuitChanged,
    circuit_subject,
    decode_event,
)
from helmline.runtime import EventStore, latest_tool_registry
from helmline.runtime.testing import eventually, run_playbook

from .mcp_servers import ROOT, federating_stack

HANGING_SERVER = ROOT / "services" / "tool-gateway" / "tests" / "mcp_test_server.py"
PERSON = Actor(id="ana")


async def test_a_step_failing_on_an_open_circuit_is_retried_when_a_probe_may_pass(
    nats_url: str, js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    server = f"hangs{uuid.uuid4().hex[:6]}"
    state = tmp_path / "server-state"
    state.mkdir()
    (state / "hang").touch()  # Its calls hang until the file goes.
    config = {
        "id": server,
        "stdio": {"command": sys.executable, "args": [str(HANGING_SERVER), str(state)]},
        "risk": "low",
        "retries": 0,
        "timeout_s": 0.5,
        # The first failure opens the breaker; a probe may pass 3 s later.
        "circuit": {"failures": 1, "reset_s": 3.0},
    }
    opened: list[ToolCircuitChanged] = []

    async def circuit(message: object) -> None:
        change = decode_event(message.data).data  # type: ignore[attr-defined]
        if isinstance(change, ToolCircuitChanged) and change.state == "open":
            opened.append(change)
            (state / "hang").unlink(missing_ok=True)  # The server would answer a probe.

    subscription = await js._nc.subscribe(circuit_subject(server), cb=circuit)
    (tmp_path / "stack").mkdir()
    try:
        with federating_stack(nats_url, tmp_path / "stack", [config]):

            async def federated() -> bool:
                registry = await latest_tool_registry(js)
                return registry is not None and any(
                    s.server == server and s.available for s in registry.servers
                )

            await eventually(federated, timeout_s=60, what=f"MCP server {server} federated")
            playbook = Playbook(goal="ask", steps=(PlanStep(id="ask", tool=f"{server}__hang"),))
            session_id = await run_playbook(store, tenant, playbook, PERSON)
    finally:
        await subscription.unsubscribe()

    events = [stored.event for stored in await store.read_all(tenant, session_id)]
    state_now = (await store.load(tenant, session_id)).state
    assert state_now.status == "completed", [(e.type, e.time, e.data) for e in events]
    (change,) = opened
    assert change.retry_at is not None
    # A failure while the breaker was open was not retried before a probe could pass: the
    # attempt that succeeded is the first one scheduled after the reset window.
    failures = [e for e in events if isinstance(e.data, ToolCallFailed)]
    assert failures
    assert all(f.data.error.retryable for f in failures)
    attempts = [e for e in events if isinstance(e.data, StepScheduled)]
    assert len(attempts) == len(failures) + 1 <= 3
    assert attempts[-1].time >= change.retry_at
    assert all(attempt.time < change.retry_at for attempt in attempts[:-1])
    # The server got the first call, which hung, and the probe; nothing in between.
    calls = (state / "calls-hang.log").read_text().splitlines()
    assert len(calls) == 2
