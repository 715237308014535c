"""Rollback latency with every service in its own process: from `rollback.requested` to
`rollback.completed`, undoing 10 and 100 steps that each changed the workspace."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from steps import run_sessions, services_running

from helmline.contracts import (
    Actor,
    Event,
    PlanStep,
    Playbook,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    RollbackRequested,
    decode_event,
    event_type_filter,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import eventually

UNDONE = (10, 100)


def writes(steps: int) -> Playbook:
    """A playbook of an `echo`, then `steps` file writes, each after the one before.

    The rollback returns to the echo's checkpoint, which stands for the workspace before
    the session changed it: that snapshot is always kept, where the first write's is pruned
    once a session has more checkpoints than the state service keeps snapshots of (100).
    """
    return Playbook(
        goal=f"{steps} writes",
        steps=(
            PlanStep(id="begin", tool="echo", arguments={"message": "begin"}),
            *(
                PlanStep(
                    id=f"w{i}",
                    tool="write_file",
                    arguments={"path": f"files/{i}.txt", "content": f"file {i}\n" * 20},
                    depends_on=(f"w{i - 1}" if i else "begin",),
                )
                for i in range(steps)
            ),
        ),
    )


async def rollback_ms(nc: NATS, store: EventStore, tenant: str, undone: int) -> float:
    """Run an echo and `undone` writes, then roll back to the echo; milliseconds taken."""
    (session_id,), _ = await run_sessions(nc, store, tenant, [writes(undone)])

    async def checkpointed() -> Any:
        state = (await store.load(tenant, session_id)).state
        return state if len(state.checkpoints) == undone + 1 else None

    state = await eventually(checkpointed, timeout_s=120, what="every checkpoint")
    ended: asyncio.Future[Event] = asyncio.get_running_loop().create_future()

    async def on_end(message: Msg) -> None:
        if not ended.done():
            ended.set_result(decode_event(message.data))

    subscriptions = [
        await nc.subscribe(event_type_filter(end.TYPE, tenant), cb=on_end)
        for end in (RollbackCompleted, RollbackRefused, RollbackFailed)
    ]
    first = (await store.read_all(tenant, session_id))[0].event
    requested = RollbackRequested(
        rollback_id="bench",
        checkpoint_id=state.checkpoints[0].checkpoint_id,
        requested_by=Actor(id="bench"),
    )
    began = time.perf_counter()
    await store.append(first.derive(requested, source="bench"))
    end = await asyncio.wait_for(ended, timeout=120)
    elapsed_ms = (time.perf_counter() - began) * 1000
    for subscription in subscriptions:
        await subscription.unsubscribe()
    if end.type != RollbackCompleted.TYPE:
        raise RuntimeError(f"the rollback of {undone} steps ended {end.type}: {end.data}")
    return elapsed_ms


async def run() -> list[dict[str, Any]]:
    figures = []
    async with services_running() as (nc, store, _):
        await rollback_ms(nc, store, "warmup", 2)
        for undone in UNDONE:
            elapsed = await rollback_ms(nc, store, f"undo{undone}", undone)
            figures.append(
                {
                    "figure": "rollback_latency_ms",
                    "steps_undone": undone,
                    "value": round(elapsed, 1),
                }
            )
    return figures
