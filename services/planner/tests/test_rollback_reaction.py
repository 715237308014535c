"""The planner around rollbacks and forks: nothing starts while a rollback runs, undone steps
run again when the session continues, and a fork starts once its workspace is restored."""

from __future__ import annotations

from helmline.contracts import (
    Actor,
    Event,
    ForkOrigin,
    Payload,
    PlanApproved,
    PlanStep,
    Playbook,
    RollbackCompleted,
    RollbackRequested,
    SessionCompleted,
    SessionResumed,
    SessionResumeRequested,
    SessionStarted,
    StepScheduled,
    ToolCallCompleted,
    WorkspaceRestored,
    fold,
    new_event,
)
from helmline.planner._domain import decide

ANA = Actor(id="ana")
CHAIN = Playbook(
    goal="g",
    steps=(
        PlanStep(id="a", tool="echo"),
        PlanStep(id="b", tool="echo", depends_on=("a",)),
        PlanStep(id="c", tool="echo", depends_on=("b",)),
    ),
)


class Session:
    def __init__(self, started: SessionStarted) -> None:
        self.root = new_event(started, tenant="t", session_id="s", source="test")
        self.events: list[Event] = []
        self.happen(self.root)

    def happen(self, event_or_payload: Event | Payload) -> list[Payload]:
        event = (
            event_or_payload
            if isinstance(event_or_payload, Event)
            else self.root.derive(event_or_payload, source="test", key=str(len(self.events)))
        )
        self.events.append(event)
        decisions = decide(fold(self.events), event)
        for index, decision in enumerate(decisions):
            self.events.append(event.derive(decision.payload, source="planner", key=str(index)))
        return [d.payload for d in decisions]

    def complete(self, step_id: str) -> list[Payload]:
        step = fold(self.events).steps[step_id]
        assert step.call_id is not None
        return self.happen(ToolCallCompleted(call_id=step.call_id, step_id=step_id, tool=step.tool))


def test_nothing_starts_during_a_rollback_and_undone_steps_run_again_on_resume() -> None:
    session = Session(SessionStarted(goal="g", playbook=CHAIN, requested_by=ANA))
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    session.complete("a")
    session.happen(RollbackRequested(rollback_id="rb", checkpoint_id="cp-a.1", requested_by=ANA))
    assert session.complete("b") == [], "a step finishing during a rollback starts nothing"

    assert (
        session.happen(
            RollbackCompleted(rollback_id="rb", checkpoint_id="cp-a.1", undone_steps=("b",))
        )
        == []
    )
    assert fold(session.events).status == "paused"

    resumed, again = session.happen(SessionResumeRequested(requested_by=ANA))
    assert isinstance(resumed, SessionResumed)
    assert isinstance(again, StepScheduled)
    assert (again.step_id, again.attempt, again.call_id) == ("b", 2, "b.2")
    session.complete("b")
    (completed,) = session.complete("c")
    assert isinstance(completed, SessionCompleted)


def test_a_session_completes_again_after_a_rollback_under_a_new_identity() -> None:
    session = Session(SessionStarted(goal="g", playbook=CHAIN, requested_by=ANA))
    session.happen(PlanApproved(revision=1, approved_by=ANA))
    for step in ("a", "b"):
        session.complete(step)
    (first,) = session.complete("c")
    session.happen(RollbackRequested(rollback_id="rb", checkpoint_id="cp-b.1", requested_by=ANA))
    session.happen(RollbackCompleted(rollback_id="rb", checkpoint_id="cp-b.1", undone_steps=("c",)))
    session.happen(SessionResumeRequested(requested_by=ANA))
    (second,) = session.complete("c")

    assert isinstance(first, SessionCompleted)
    assert isinstance(second, SessionCompleted)
    ends = [e for e in session.events if isinstance(e.data, SessionCompleted)]
    assert len({e.id for e in ends}) == 2, "the second end is not taken for a duplicate"


def test_a_fork_runs_only_what_its_origin_had_not_done_once_its_workspace_is_restored() -> None:
    origin = ForkOrigin(session_id="src", at_seq=9, snapshot_id="snap-a", completed_steps=("a",))
    session = Session(SessionStarted(goal="g", playbook=CHAIN, requested_by=ANA, fork_of=origin))

    assert session.happen(PlanApproved(revision=1, approved_by=ANA)) == []
    (scheduled,) = session.happen(WorkspaceRestored(snapshot_id="snap-a"))

    assert isinstance(scheduled, StepScheduled)
    assert scheduled.step_id == "b"
    assert fold(session.events).steps["a"].tool == "echo"
