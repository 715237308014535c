"""Checkpoints and rollback plans as pure functions of a session's log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalGranted,
    ApprovalRequested,
    CompensationCompleted,
    CompensationScheduled,
    Event,
    InverseCall,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    Playbook,
    RollbackCompleted,
    RollbackRefused,
    RollbackRequested,
    SessionPaused,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallDenied,
    ToolSpec,
    WorkspaceSnapshotted,
    fold,
    new_event,
)
from helmline.state._checkpoints import checkpoint_after, snapshots_beyond
from helmline.state._rollback import (
    Decision,
    RollbackPlan,
    call_outcome,
    next_decisions,
    plan_rollback,
)

ANA = Actor(id="ana")
TICKETS = ToolSpec(
    name="tickets__open",
    description="Open a ticket.",
    parameters={"type": "object"},
    risk="medium",
    executor="gateway",
)
CLOCK = TICKETS.model_copy(update={"name": "clock__now", "effect": "none"})
TOOLS = {**BUILTIN_TOOLS_BY_NAME, TICKETS.name: TICKETS, CLOCK.name: CLOCK}


class Session:
    """A session's log as the services would write it, one completed step at a time."""

    def __init__(self, *steps: tuple[str, str]) -> None:
        playbook = Playbook(
            goal="g",
            steps=tuple(PlanStep(id=step, tool=tool) for step, tool in steps),
        )
        self.root = new_event(
            SessionStarted(goal="g", playbook=playbook, requested_by=ANA),
            tenant="t",
            session_id="s",
            source="test",
        )
        self.events: list[Event] = [self.root]
        self.seqs: dict[str, int] = {}
        self.add(PlanProposed(revision=1, steps=playbook.steps))
        self.add(PlanApproved(revision=1, approved_by=ANA))

    def add(self, payload: Payload) -> SessionState:
        self.events.append(self.root.derive(payload, source="test", key=str(len(self.events))))
        return self.state

    @property
    def state(self) -> SessionState:
        return fold(self.events)

    def run(self, step: str, tool: str, *, snapshot: str | None = None, **completed: Any) -> None:
        call = f"{step}.1"
        self.add(StepScheduled(step_id=step, call_id=call, tool=tool))
        if snapshot is not None:
            if len(self.events) and self.state.initial_snapshot_id is None:
                self.add(WorkspaceSnapshotted(snapshot_id="before"))
            self.add(
                WorkspaceSnapshotted(
                    snapshot_id=snapshot,
                    call_id=call,
                    irreversible_reason=completed.pop("unstored", None),
                )
            )
        done = ToolCallCompleted(call_id=call, step_id=step, tool=tool, **completed)
        state = self.add(done)
        self.seqs[step] = len(self.events)
        self.add(checkpoint_after(state, done, len(self.events), TOOLS))

    def request(self, checkpoint: int, *, accept_partial: bool = False) -> SessionState:
        requested = RollbackRequested(
            rollback_id="rb",
            checkpoint_id=self.state.checkpoints[checkpoint - 1].checkpoint_id,
            requested_by=ANA,
            accept_partial=accept_partial,
        )
        return self.add(requested)

    def plan(self) -> RollbackPlan:
        now = self.state
        rollback = now.rollbacks["rb"]
        target = next(c for c in now.checkpoints if c.checkpoint_id == rollback.checkpoint_id)
        then = fold(self.events[: target.at_seq])
        return plan_rollback(now, then, rollback)

    def decide(self) -> list[Payload]:
        decisions: list[Decision] = next_decisions(self.plan(), self.state, "rb")
        for decision in decisions:
            self.add(decision.payload)
        return [d.payload for d in decisions]

    def restore_then_call(self) -> StepScheduled:
        """Let the sandbox finish the workspace restore; the undo call scheduled next."""
        (restore,) = self.decide()
        assert isinstance(restore, CompensationScheduled)
        self.add(CompensationCompleted(**_ids(restore), steps=restore.steps))
        _, call = self.decide()
        assert isinstance(call, StepScheduled)
        return call

    def answer(self, outcome: ToolCallCompleted | ToolCallDenied) -> None:
        """The undo call's outcome, as the state service turns it into a compensation's."""
        decided = call_outcome(self.plan(), self.state.rollbacks["rb"], outcome)
        assert decided is not None
        self.add(decided.payload)


TICKET = InverseCall(tool="tickets__close", arguments={"id": 7})


def four_steps() -> Session:
    session = Session(
        ("write", "write_file"),
        ("say", "echo"),
        ("ticket", "tickets__open"),
        ("edit", "write_file"),
    )
    session.run("write", "write_file", snapshot="after-write")
    session.run("say", "echo")
    session.run("ticket", "tickets__open", output={"id": 7}, inverse=TICKET)
    session.run("edit", "write_file", snapshot="after-edit")
    return session


def test_checkpoints_say_how_each_step_is_undone() -> None:
    checkpoints = four_steps().state.checkpoints

    assert [(c.step_id, c.effect, c.reversible) for c in checkpoints] == [
        ("write", "workspace", True),
        ("say", "none", True),
        ("ticket", "external", True),
        ("edit", "workspace", True),
    ]
    assert checkpoints[0].compensation == "restore the workspace to snapshot before"
    assert checkpoints[2].inverse == TICKET
    assert checkpoints[3].snapshot_id == "after-edit"


def test_a_tool_acting_outside_without_an_inverse_is_irreversible_unless_it_changes_nothing() -> (
    None
):
    session = Session(("ticket", "tickets__open"), ("now", "clock__now"))
    session.run("ticket", "tickets__open", output={"id": 7})
    session.run("now", "clock__now")

    ticket, now = session.state.checkpoints
    assert not ticket.reversible
    assert ticket.compensation == "tickets__open acts outside Helmline and declares no inverse"
    assert now.reversible


def test_rollback_restores_the_workspace_once_and_calls_the_inverse_latest_first() -> None:
    session = four_steps()
    session.request(1)

    plan = session.plan()

    assert plan.blocking_steps == ()
    assert plan.reset_steps == ("edit", "ticket", "say")
    assert [(c.kind, c.steps, c.snapshot_id, c.tool) for c in plan.compensations] == [
        ("restore_workspace", ("edit",), "after-write", None),
        ("inverse_tool", ("ticket",), None, "tickets__close"),
    ]


def test_a_rollback_runs_one_compensation_at_a_time_and_ends_where_the_checkpoint_was() -> None:
    session = four_steps()
    session.request(1)

    (restore,) = session.decide()
    assert isinstance(restore, CompensationScheduled)
    assert session.decide() == [], "nothing more until the restore is done"
    session.add(CompensationCompleted(**_ids(restore), steps=restore.steps))

    scheduled, call = session.decide()
    assert isinstance(scheduled, CompensationScheduled)
    assert isinstance(call, StepScheduled)
    assert (call.tool, call.arguments, call.compensation_id) == (
        "tickets__close",
        {"id": 7},
        scheduled.compensation_id,
    )
    assert call.step_id not in session.state.steps, "the undo call is not a step of the plan"
    session.answer(ToolCallCompleted(call_id=call.call_id, step_id=call.step_id, tool=call.tool))

    (completed,) = session.decide()
    assert isinstance(completed, RollbackCompleted)
    assert completed.undone_steps == ("edit", "ticket", "say")
    state = session.state
    assert state.status == "paused"
    assert [c.step_id for c in state.checkpoints] == ["write"]
    assert {s.id: s.status for s in state.steps.values()} == {
        "write": "succeeded",
        "say": "undone",
        "ticket": "undone",
        "edit": "undone",
    }
    assert session.decide() == [], "an ended rollback decides nothing more"


def test_an_undo_call_lost_after_its_compensation_was_recorded_is_scheduled_again() -> None:
    session = four_steps()
    session.request(1)
    (restore,) = session.decide()
    assert isinstance(restore, CompensationScheduled)
    session.add(CompensationCompleted(**_ids(restore), steps=restore.steps))
    decided = next_decisions(session.plan(), session.state, "rb")
    # The service was killed after the first of the two appends.
    session.add(decided[0].payload)

    assert next_decisions(session.plan(), session.state, "rb") == decided[1:]
    session.add(decided[1].payload)
    assert session.decide() == [], "nothing more until the undo call's outcome"


def test_an_irreversible_step_refuses_the_rollback_naming_it_unless_partial_is_accepted() -> None:
    refused = four_steps()
    refused.run("notify", "tickets__open", output={"sent": True})
    refused.request(1)

    (refusal,) = refused.decide()
    assert isinstance(refusal, RollbackRefused)
    assert refusal.blocking_steps == ("notify",)
    assert "notify" in refusal.reason

    partial = four_steps()
    partial.run("notify", "tickets__open", output={"sent": True})
    partial.request(1, accept_partial=True)
    call = partial.restore_then_call()
    partial.answer(ToolCallCompleted(call_id=call.call_id, step_id=call.step_id, tool=call.tool))
    (completed,) = partial.decide()
    assert isinstance(completed, RollbackCompleted)
    assert completed.not_undone_steps == ("notify",)
    assert completed.undone_steps == ("edit", "ticket", "say")


def test_a_denied_undo_call_fails_the_rollback_saying_what_was_undone() -> None:
    session = four_steps()
    session.request(1)
    call = session.restore_then_call()
    session.answer(
        ToolCallDenied(call_id=call.call_id, step_id=call.step_id, tool=call.tool, reason="no")
    )

    (failed,) = session.decide()
    assert failed.TYPE == "rollback.failed"
    assert session.state.rollbacks["rb"].undone_steps == ("edit", "say")
    assert session.state.rollbacks["rb"].not_undone_steps == ("ticket",)


def test_a_workspace_that_was_not_stored_at_the_checkpoint_blocks_the_steps_that_changed_it() -> (
    None
):
    session = Session(("big", "write_file"), ("small", "write_file"))
    session.run("big", "write_file", snapshot="after-big", unstored="above the cap")
    session.run("small", "write_file", snapshot="after-small")
    big, small = session.state.checkpoints
    assert big.reversible, "the workspace before it was stored"
    assert "no rollback can return to this checkpoint" in (big.compensation or "")
    assert not small.reversible
    session.request(1)

    (refusal,) = session.decide()

    assert isinstance(refusal, RollbackRefused)
    assert refusal.blocking_steps == ("small",)


def test_past_the_snapshots_kept_the_oldest_go_and_a_rollback_to_them_is_refused() -> None:
    session = Session(
        ("one", "write_file"), ("look", "read_file"), ("two", "write_file"),
        ("three", "write_file"),
    )  # fmt: skip
    session.run("one", "write_file", snapshot="after-one")
    session.run("look", "read_file")  # Changes nothing: its checkpoint shares after-one.
    assert snapshots_beyond(session.state, 2) is None
    session.run("two", "write_file", snapshot="after-two")
    assert snapshots_beyond(session.state, 2) is None
    session.run("three", "write_file", snapshot="after-three")

    pruned = snapshots_beyond(session.state, 2)

    assert pruned is not None
    # The workspace before the session's first change stays, for a rollback to the start.
    assert pruned.snapshot_ids == ("after-one",)
    assert "newest 2 workspace snapshots" in pruned.reason
    session.add(pruned)
    assert snapshots_beyond(session.state, 2) is None
    # The log keeps every checkpoint; a rollback to a pruned one cannot restore it.
    assert len(session.state.checkpoints) == 4
    session.request(2)
    (refusal,) = session.decide()
    assert isinstance(refusal, RollbackRefused)
    assert refusal.blocking_steps == ("three", "two")


def test_a_rollback_does_not_start_while_a_step_may_still_run() -> None:
    session = four_steps()
    session.add(StepScheduled(step_id="late", call_id="late.1", tool="echo"))
    session.request(1)

    (refusal,) = session.decide()

    assert isinstance(refusal, RollbackRefused)
    assert "steps late may still run: wait for them to finish or pause" in refusal.reason
    assert refusal.blocking_steps == ()


def test_in_a_paused_session_a_rollback_refused_under_a_call_says_what_it_waits_for() -> None:
    session = four_steps()
    session.add(StepScheduled(step_id="asked", call_id="asked.1", tool="run_command"))
    session.add(_asked("req-asked", "asked"))
    session.add(StepScheduled(step_id="held", call_id="held.1", tool="run_command"))
    session.add(_asked("req-held", "held"))
    session.add(StepScheduled(step_id="late", call_id="late.1", tool="echo"))
    session.add(ToolCallAuthorized(call_id="late.1", step_id="late", tool="echo", risk="low"))
    session.add(SessionPaused())
    session.add(ApprovalDecisionSubmitted(request_id="req-held", decision="grant", decided_by=ANA))
    session.add(ApprovalGranted(request_id="req-held", decided_by=(ANA,)))
    session.request(1)

    (refusal,) = session.decide()

    assert isinstance(refusal, RollbackRefused)
    # No advice to pause a paused session: a decision or a resume is what lets it start.
    assert "pause" not in refusal.reason
    assert "steps late may still run: wait for them to finish" in refusal.reason
    assert "step asked waits for a decision on req-asked" in refusal.reason
    assert "step held was granted and runs when the session resumes" in refusal.reason


def _asked(request_id: str, step_id: str) -> ApprovalRequested:
    return ApprovalRequested(
        request_id=request_id,
        scope="step",
        step_id=step_id,
        call_id=f"{step_id}.1",
        tool="run_command",
        risk="high",
        reason="high risk",
        expires_at=datetime.now(UTC) + timedelta(minutes=10),
    )


def _ids(scheduled: CompensationScheduled) -> dict[str, str]:
    return {
        "rollback_id": scheduled.rollback_id,
        "compensation_id": scheduled.compensation_id,
        "step_id": scheduled.step_id,
    }
