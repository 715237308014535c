"""Goal sessions as the end-to-end tests start and watch them: started by appending
`session.started`, as the API does, and read back from the log."""

from __future__ import annotations

import uuid
from typing import Literal

from helmline.contracts import Actor, Event, SessionStarted, SessionState, new_event
from helmline.runtime import EventStore
from helmline.runtime.testing import eventually

OPERATOR = Actor(id="ana", roles=("operator", "approver"))


async def start(
    store: EventStore, tenant: str, goal: str, mode: Literal["plan", "act"] = "plan"
) -> str:
    session_id = uuid.uuid4().hex
    started = SessionStarted(goal=goal, mode=mode, requested_by=OPERATOR)
    await store.append(new_event(started, tenant=tenant, session_id=session_id, source="test"))
    return session_id


async def ended(store: EventStore, tenant: str, session_id: str) -> SessionState:
    async def reached() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.is_terminal else None

    state: SessionState = await eventually(reached, timeout_s=60, what="the session to end")
    return state


async def log_of(store: EventStore, tenant: str, session_id: str) -> list[Event]:
    return [stored.event for stored in await store.read_all(tenant, session_id)]
