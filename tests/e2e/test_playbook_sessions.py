"""A session's whole life across the services, each in its own process."""

from __future__ import annotations

import uuid
from typing import Any

from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    PlanStep,
    Playbook,
    SessionStarted,
    SessionState,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, eventually

OPERATOR = Actor(id="ana", roles=("operator", "approver"))


def _step(
    step_id: str, tool: str = "echo", depends_on: tuple[str, ...] = (), **arguments: Any
) -> PlanStep:
    arguments = arguments or {"message": step_id}
    return PlanStep(id=step_id, tool=tool, arguments=arguments, depends_on=depends_on)


async def _start(store: EventStore, tenant: str, playbook: Playbook) -> str:
    session_id = uuid.uuid4().hex
    started = SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=OPERATOR)
    await store.append(new_event(started, tenant=tenant, session_id=session_id, source="test"))
    return session_id


async def _until(store: EventStore, tenant: str, session_id: str, *statuses: str) -> SessionState:
    async def reached() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.status in statuses else None

    state: SessionState = await eventually(
        reached, timeout_s=30, what=f"session {' or '.join(statuses)}"
    )
    return state


async def test_a_chain_of_steps_completes_with_a_checkpoint_each(
    services: ServiceProcesses, store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="say three things",
        steps=(
            _step("a"),
            _step("b", depends_on=("a",)),
            _step("c", depends_on=("b",)),
        ),
    )
    session_id = await _start(store, tenant, playbook)
    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome
    assert [s.output for s in state.steps.values()] == [
        {"message": "a"},
        {"message": "b"},
        {"message": "c"},
    ]
    await eventually(lambda: _checkpoints(store, tenant, session_id, 3), what="3 checkpoints")


async def _checkpoints(store: EventStore, tenant: str, session_id: str, count: int) -> bool:
    return len((await store.load(tenant, session_id)).state.checkpoints) == count


async def test_independent_steps_run_before_the_step_that_joins_them(
    services: ServiceProcesses, store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="fan out and in",
        steps=(
            _step("left"),
            _step("right"),
            _step("join", depends_on=("left", "right")),
        ),
    )
    session_id = await _start(store, tenant, playbook)
    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome
    join = state.steps["join"]
    assert join.scheduled_at is not None
    for side in ("left", "right"):
        finished = state.steps[side].finished_at
        assert finished is not None
        assert finished <= join.scheduled_at


async def test_a_high_risk_step_waits_for_a_person_and_a_denial_fails_the_session(
    services: ServiceProcesses, store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="risky",
        steps=(
            _step("prepare"),
            _step("wipe", tool="run_command", depends_on=("prepare",), command="touch wiped"),
        ),
    )
    session_id = await _start(store, tenant, playbook)
    waiting = await _until(store, tenant, session_id, "waiting")
    (request,) = waiting.pending_approvals
    assert request.step_id == "wipe"
    assert request.risk == "high"

    started = (await store.read_all(tenant, session_id))[0].event
    vote = ApprovalDecisionSubmitted(
        request_id=request.request_id, decision="deny", decided_by=OPERATOR, comment="not today"
    )
    await store.append(started.derive(vote, source="test"))

    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "failed"
    assert "denied by ana: not today" in state.outcome
    assert state.steps["wipe"].status == "denied"


async def test_a_step_its_playbook_asks_a_person_about_waits_though_the_policy_allows_it(
    services: ServiceProcesses, store: EventStore, tenant: str
) -> None:
    asked = _step("announce").model_copy(update={"requires_approval": True})
    playbook = Playbook(goal="ask first", steps=(_step("prepare"), asked))
    session_id = await _start(store, tenant, playbook)

    waiting = await _until(store, tenant, session_id, "waiting")
    (request,) = waiting.pending_approvals
    assert (request.step_id, request.tool, request.risk) == ("announce", "echo", "low")
    assert "the plan asks a person" in request.reason
    assert waiting.steps["prepare"].status == "succeeded"
    assert waiting.steps["announce"].status != "succeeded"

    started = (await store.read_all(tenant, session_id))[0].event
    vote = ApprovalDecisionSubmitted(
        request_id=request.request_id, decision="grant", decided_by=OPERATOR
    )
    await store.append(started.derive(vote, source="test"))

    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed"
    assert state.steps["announce"].output == {"message": "announce"}


async def test_a_denied_step_is_skipped_with_its_dependants_when_the_plan_continues(
    services: ServiceProcesses, store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="best effort",
        on_denied="continue",
        steps=(
            _step("mystery", tool="no_such_tool"),
            _step("after", depends_on=("mystery",)),
            _step("aside"),
        ),
    )
    session_id = await _start(store, tenant, playbook)
    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome
    assert state.steps["mystery"].status == "skipped"
    assert "unknown tool 'no_such_tool'" in (state.steps["mystery"].reason or "")
    assert state.steps["after"].status == "skipped"
    assert state.steps["aside"].status == "succeeded"
