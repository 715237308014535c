"""100 sessions through every service, each its own process: the read model equals the fold of
each session's log, row by row and column by column, although PostgreSQL crashed mid-run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    Event,
    PlanStep,
    Playbook,
    SessionStarted,
    SessionState,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, eventually
from helmline.state import caught_up, read_model_differences

SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
SESSIONS = 100
OPERATOR = Actor(id="ana", roles=("operator", "approver"))
ENDED = ("completed", "failed", "cancelled")


@pytest.fixture
def stack(
    own_log: tuple[str, EventStore], own_postgres: Any, tmp_path: Path
) -> Iterator[ServiceProcesses]:
    """Every service on a log of the test's own, the state service keeping the read model."""
    folder = tmp_path / "services"
    folder.mkdir()
    processes = ServiceProcesses(own_log[0], folder)
    try:
        for name in SERVICES:
            read_model = {"HELMLINE_DATABASE_URL": own_postgres.url} if name == "state" else {}
            processes.start(name, env=read_model)
        yield processes
    finally:
        processes.stop_all()


def _playbook(number: int) -> Playbook:
    steps = [
        PlanStep(id="hello", tool="echo", arguments={"message": f"hello {number}"}),
        PlanStep(id="again", tool="echo", arguments={"message": "again"}, depends_on=("hello",)),
    ]
    if number % 4 == 0:
        # Commands need a person's approval by default: half are granted, half denied.
        steps.append(
            PlanStep(
                id="touch",
                tool="run_command",
                arguments={"command": f"touch note-{number}"},
                depends_on=("again",),
            )
        )
    return Playbook(goal=f"session {number}", steps=tuple(steps))


async def _start(store: EventStore, tenant: str, number: int) -> Event:
    started = new_event(
        SessionStarted(goal=f"session {number}", playbook=_playbook(number), requested_by=OPERATOR),
        tenant=tenant,
        session_id=f"s{number:03}-{uuid.uuid4().hex[:6]}",
        source="test",
    )
    await store.append(started)
    return started


async def _states(store: EventStore, tenant: str, started: list[Event]) -> list[SessionState]:
    return [(await store.load(tenant, s.session_id)).state for s in started]


async def _decide_waiting(
    store: EventStore, started: list[Event], states: list[SessionState]
) -> None:
    for first, state in zip(started, states, strict=True):
        for request in state.pending_approvals:
            decision = "grant" if int(state.goal.split()[1]) % 8 == 0 else "deny"
            vote = ApprovalDecisionSubmitted(
                request_id=request.request_id, decision=decision, decided_by=OPERATOR
            )
            await store.append(first.derive(vote, source="test", key=request.request_id))


async def _all_ended(store: EventStore, tenant: str, started: list[Event]) -> bool:
    states = await _states(store, tenant, started)
    await _decide_waiting(store, started, states)
    return all(state.status in ENDED for state in states)


async def test_the_read_model_equals_the_fold_of_100_sessions_across_a_postgres_crash(
    stack: ServiceProcesses, own_log: tuple[str, EventStore], own_postgres: Any, tenant: str
) -> None:
    _, store = own_log
    started = [await _start(store, tenant, number) for number in range(SESSIONS // 2)]
    own_postgres.stop(crash=True)
    started += [await _start(store, tenant, number) for number in range(SESSIONS // 2, SESSIONS)]
    await eventually(
        lambda: _all_ended(store, tenant, started[: SESSIONS // 4]),
        timeout_s=120,
        interval_s=0.5,
        what="the first sessions to end while PostgreSQL is down",
    )
    own_postgres.start()
    await eventually(
        lambda: _all_ended(store, tenant, started),
        timeout_s=180,
        interval_s=0.5,
        what="every session to end",
    )
    await eventually(
        lambda: caught_up(store, own_postgres.url, tenant, SESSIONS),
        timeout_s=180,
        interval_s=0.5,
        what="the read model to catch up with every session",
    )

    states = await _states(store, tenant, started)
    assert {state.status for state in states} == {"completed", "failed"}
    assert sum(len(state.approvals) for state in states) == SESSIONS // 4
    for state in states:
        assert await read_model_differences(own_postgres.url, state) == [], state.session_id
