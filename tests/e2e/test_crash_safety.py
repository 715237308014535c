"""Kill -9 each service in the middle of a session: it completes, and no tool runs twice."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from pydantic import TypeAdapter

from helmline.contracts import (
    Actor,
    PlanStep,
    Playbook,
    SessionStarted,
    SessionState,
    fold,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, auto_approver, checkpointed, eventually

APPROVER = Actor(id="robot", roles=("approver",))
STEPS = 10


def _appending_commands() -> Playbook:
    return Playbook(
        goal="count side effects",
        steps=tuple(
            PlanStep(
                id=f"s{i}",
                tool="run_command",
                arguments={"command": f"echo s{i} >> ran.log"},
                depends_on=(f"s{i - 1}",) if i else (),
            )
            for i in range(STEPS)
        ),
    )


@pytest.mark.parametrize("victim", ["planner", "approval", "tool_gateway", "state", "sandbox"])
async def test_a_session_survives_a_kill_and_runs_each_tool_once(
    services: ServiceProcesses, nc: NATS, store: EventStore, tenant: str, victim: str
) -> None:
    session_id = uuid.uuid4().hex
    async with auto_approver(nc, store, tenant, APPROVER) as approver:
        await store.append(
            new_event(
                SessionStarted(
                    goal="crash me", playbook=_appending_commands(), requested_by=APPROVER
                ),
                tenant=tenant,
                session_id=session_id,
                source="test",
            )
        )

        async def some_steps_done() -> bool:
            state = (await store.load(tenant, session_id)).state
            return sum(s.status == "succeeded" for s in state.steps.values()) >= 3

        await eventually(some_steps_done, timeout_s=30, what="three steps done")
        if victim == "sandbox":
            # A command killed with its sandbox is failed as interrupted, by design: it may
            # have half-run and is never run twice. So the sandbox dies between commands,
            # while the next one waits for its approval.
            approver.holding = True
            # Not "the session is waiting": a request granted just before holding began
            # shows as waiting too, for the few milliseconds until its command starts.
            await eventually(lambda: approver.held_back > 0, timeout_s=30, what="a step held")
        services.kill(victim)
        await asyncio.to_thread(services.start, victim)
        await approver.release()

        async def ended() -> bool:
            return (await store.load(tenant, session_id)).state.is_terminal

        await eventually(ended, timeout_s=60, what="the session to end")

    state = await checkpointed(store, tenant, session_id)
    assert state.status == "completed", state.outcome
    ran_log = Path(services.data_dir, "workspaces", tenant, session_id, "ran.log")
    ran = await asyncio.to_thread(ran_log.read_text)
    assert ran.split() == [f"s{i}" for i in range(STEPS)]
    shown = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("helmline")),
        "show",
        session_id,
        "--tenant",
        tenant,
        "--json",
        env={"HELMLINE_NATS_URL": services.nats_url, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(shown.communicate(), timeout=60)
    folded = fold(item.event for item in await store.read_all(tenant, session_id))
    assert TypeAdapter(SessionState).validate_json(out) == folded
