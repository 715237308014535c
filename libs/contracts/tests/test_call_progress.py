"""How far a call got, as a session's state tells a service handed the call again."""

from __future__ import annotations

from helmline.contracts import (
    Actor,
    CompensationCompleted,
    CompensationScheduled,
    Payload,
    PlanProposed,
    PlanStep,
    RollbackRequested,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    ToolError,
    fold,
    new_event,
)

ANA = Actor(id="ana")


def _state_after(*payloads: Payload) -> SessionState:
    started = new_event(
        SessionStarted(goal="progress", requested_by=ANA), tenant="t", session_id="s", source="test"
    )
    plan = PlanProposed(revision=1, steps=(PlanStep(id="s1", tool="echo"),))
    events = [started, started.derive(plan, source="test")]
    events += [started.derive(data, source="test", key=str(i)) for i, data in enumerate(payloads)]
    return fold(events)


SCHEDULED = StepScheduled(step_id="s1", call_id="c1", tool="echo")
AUTHORIZED = ToolCallAuthorized(call_id="c1", step_id="s1", tool="echo", risk="low", rule="r")
STARTED = ToolCallStarted(call_id="c1", step_id="s1", tool="echo")


def test_a_call_is_not_started_until_it_is_sent_then_finished_with_its_outcome() -> None:
    assert _state_after().call_progress("c1") == "not started"
    assert _state_after(SCHEDULED, AUTHORIZED).call_progress("c1") == "not started"
    assert _state_after(SCHEDULED, AUTHORIZED, STARTED).call_progress("c1") == "started"
    completed = ToolCallCompleted(call_id="c1", step_id="s1", tool="echo", output="ok")
    assert _state_after(SCHEDULED, AUTHORIZED, STARTED, completed).call_progress("c1") == (
        "finished"
    )
    failed = ToolCallFailed(
        call_id="c1", step_id="s1", tool="echo", error=ToolError(kind="execution", message="x")
    )
    assert _state_after(SCHEDULED, AUTHORIZED, failed).call_progress("c1") == "finished"


def test_an_attempt_a_newer_one_replaced_is_finished() -> None:
    again = StepScheduled(step_id="s1", call_id="c2", tool="echo", attempt=2)
    state = _state_after(SCHEDULED, AUTHORIZED, STARTED, again)
    assert state.call_progress("c1") == "finished"
    assert state.call_progress("c2") == "not started"


def test_an_undo_call_counts_as_started_until_its_compensation_ends() -> None:
    rollback = RollbackRequested(rollback_id="r1", checkpoint_id="k1", requested_by=ANA)
    ids = {"rollback_id": "r1", "compensation_id": "u1", "step_id": "s1"}
    scheduled = CompensationScheduled(**ids, kind="inverse_tool", tool="undo")
    undo = StepScheduled(step_id="undo-s1", call_id="u1", tool="undo", compensation_id="u1")
    state = _state_after(rollback, scheduled, undo)
    assert state.call_progress("u1") == "started"
    ended = _state_after(rollback, scheduled, undo, CompensationCompleted(**ids))
    assert ended.call_progress("u1") == "finished"
