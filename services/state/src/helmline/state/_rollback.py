"""Rollback as compensating events: what must be undone, in which order, and what comes next.

Pure. The plan is worked out from the log alone (the session as it is now and as it was at
the checkpoint), and every decision is a function of the plan and of the compensations the
log already records, so a redelivered or restarted handler decides the same thing again,
never schedules a compensation twice, and finishes scheduling one it was stopped halfway
through (the compensation recorded, its undo call not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from helmline.contracts import (
    IN_FLIGHT_STEPS,
    Arguments,
    CheckpointState,
    CompensationCompleted,
    CompensationFailed,
    CompensationScheduled,
    Payload,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    RollbackState,
    SessionState,
    StepScheduled,
    StepState,
    ToolCallDenied,
    ToolCallFailed,
    ToolError,
)
from helmline.state._checkpoints import effect_of


@dataclass(frozen=True, slots=True)
class Compensation:
    """One undo action of a rollback."""

    compensation_id: str
    step_id: str
    """The step it undoes (the latest, when it undoes several)."""
    steps: tuple[str, ...]
    """Every step it undoes."""
    kind: Literal["restore_workspace", "inverse_tool"]
    snapshot_id: str | None = None
    tool: str | None = None
    arguments: Arguments | None = None

    def scheduled(self, rollback_id: str) -> CompensationScheduled:
        """The event that schedules it."""
        return CompensationScheduled(
            rollback_id=rollback_id,
            compensation_id=self.compensation_id,
            step_id=self.step_id,
            kind=self.kind,
            snapshot_id=self.snapshot_id,
            tool=self.tool,
            arguments=self.arguments,
            steps=self.steps,
        )


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    """What a rollback must do, or why it cannot start."""

    compensations: tuple[Compensation, ...] = ()
    """Undo actions, in the order they run (the latest effects first)."""
    reset_steps: tuple[str, ...] = ()
    """Every step whose state changed after the checkpoint, latest first: the session
    returns each to where it was (undone: to be run again when the session continues)."""
    blocking_steps: tuple[str, ...] = ()
    """Steps that cannot be undone, latest first."""
    problem: str | None = None
    """Why the rollback cannot start at all, whatever the requester accepts."""


@dataclass(frozen=True, slots=True)
class Decision:
    """An event to append, stored once whatever delivery decided it."""

    payload: Payload
    identity: str


def plan_rollback(now: SessionState, then: SessionState, rollback: RollbackState) -> RollbackPlan:
    """The plan of `rollback`, from the session `now` and as it was at the checkpoint."""
    index = _checkpoint_index(now, rollback.checkpoint_id)
    if index is None:
        return RollbackPlan(problem=f"the session has no checkpoint {rollback.checkpoint_id!r}")
    in_flight = [step for step in now.steps.values() if step.status in IN_FLIGHT_STEPS]
    if in_flight:
        return RollbackPlan(problem=_in_flight_problem(now, in_flight))
    target = now.checkpoints[index]
    later = tuple(reversed(now.checkpoints[index + 1 :]))
    reset = [
        step.id
        for step in reversed(now.steps.values())
        if step.status != _status_then(then, step.id)
    ]
    # Steps that changed the workspace, whether they succeeded or not; from the plan, not
    # from snapshots, so that the plan stays the same while the rollback restores them.
    workspace_steps = tuple(s for s in reset if effect_of(now.steps[s].tool) == "workspace")
    restore_to = target.snapshot_id or now.initial_snapshot_id
    blocking: list[str] = []
    if workspace_steps and (restore_to is None or restore_to in now.unrestorable_snapshots):
        # The workspace cannot go back: every step that changed it stays as it is.
        blocking += workspace_steps
        restore_to = None
    blocking += [c.step_id for c in later if c.effect == "external" and c.inverse is None]
    compensations = _compensations(
        rollback.rollback_id, later, restore_to if workspace_steps else None, workspace_steps
    )
    return RollbackPlan(
        compensations=compensations,
        reset_steps=tuple(reset),
        blocking_steps=tuple(dict.fromkeys(blocking)),
    )


def _in_flight_problem(now: SessionState, in_flight: list[StepState]) -> str:
    """Why a rollback cannot start under steps whose calls may still run, and what lets it.
    A pause lets no new call start, but a call a person is asked about runs once granted,
    and one granted while the session was paused runs when it resumes."""
    asking = {r.call_id: r.request_id for r in now.pending_approvals if r.call_id is not None}
    held = {r.call_id for r in now.held_grants} if now.status == "paused" else set()
    running, waiting = [], []
    for step in in_flight:
        if step.call_id in asking:
            waiting.append(f"step {step.id} waits for a decision on {asking[step.call_id]}")
        elif step.call_id in held:
            waiting.append(f"step {step.id} was granted and runs when the session resumes")
        else:
            running.append(step.id)
    problems = []
    if running:
        how = "wait for them to finish"
        if now.status != "paused":
            how += " or pause the session first"
        problems.append(f"steps {', '.join(running)} may still run: {how}")
    if waiting:
        problems.append(
            f"{'; '.join(waiting)}: deny what waits for a decision, or let the calls run, "
            "then roll back"
        )
    return "; ".join(problems)


def _checkpoint_index(state: SessionState, checkpoint_id: str) -> int | None:
    for index, checkpoint in enumerate(state.checkpoints):
        if checkpoint.checkpoint_id == checkpoint_id:
            return index
    return None


def _status_then(then: SessionState, step_id: str) -> str:
    step = then.steps.get(step_id)
    return step.status if step is not None else "pending"


def _compensations(
    rollback_id: str,
    later: tuple[CheckpointState, ...],
    restore_to: str | None,
    workspace_steps: tuple[str, ...],
) -> tuple[Compensation, ...]:
    """Undo actions, latest effect first; one restore stands for every workspace change and
    takes the place of the latest of them."""
    compensations: list[Compensation] = []
    restore_pending = restore_to is not None

    def restore() -> None:
        nonlocal restore_pending
        restore_pending = False
        compensations.append(
            Compensation(
                compensation_id=_compensation_id(rollback_id, len(compensations) + 1),
                step_id=workspace_steps[0],
                steps=workspace_steps,
                kind="restore_workspace",
                snapshot_id=restore_to,
            )
        )

    for checkpoint in later:
        if checkpoint.step_id in workspace_steps and restore_pending:
            restore()
        elif checkpoint.effect == "external" and checkpoint.inverse is not None:
            compensations.append(
                Compensation(
                    compensation_id=_compensation_id(rollback_id, len(compensations) + 1),
                    step_id=checkpoint.step_id,
                    steps=(checkpoint.step_id,),
                    kind="inverse_tool",
                    tool=checkpoint.inverse.tool,
                    arguments=checkpoint.inverse.arguments,
                )
            )
    if restore_pending:
        restore()  # Only calls that failed changed the workspace.
    return tuple(compensations)


def _compensation_id(rollback_id: str, number: int) -> str:
    return f"{rollback_id}.undo{number}"


_UNDO = "undo."


def compensation_step_id(step_id: str) -> str:
    """The step id an inverse call runs under: apart from the plan's steps, so that the call
    is judged and run like any other without being taken for a step of the plan."""
    return f"{_UNDO}{step_id}"[:64]


def is_undo_step(step_id: str) -> bool:
    """Whether a call's step id may be a rollback's undo call (the log tells for sure)."""
    return step_id.startswith(_UNDO)


def next_decisions(plan: RollbackPlan, now: SessionState, rollback_id: str) -> list[Decision]:
    """What the rollback does next, given what the session's log records of it so far."""
    rollback = now.rollbacks[rollback_id]
    if not rollback.active:
        return []
    if not rollback.compensations:
        refusal = _refusal(plan, rollback)
        if refusal is not None:
            return [Decision(refusal, f"rollback/{rollback_id}/refused")]
    status = rollback.compensations.get
    done = tuple(c for c in plan.compensations if status(c.compensation_id) == "completed")
    failed = next((c for c in plan.compensations if status(c.compensation_id) == "failed"), None)
    if failed is not None:
        undone = _undone(plan, done)
        return [
            Decision(
                RollbackFailed(
                    rollback_id=rollback_id,
                    checkpoint_id=rollback.checkpoint_id,
                    reason=f"undoing step {failed.step_id!r} failed",
                    undone_steps=undone,
                    not_undone_steps=tuple(s for s in plan.reset_steps if s not in undone),
                ),
                f"rollback/{rollback_id}/end",
            )
        ]
    for compensation in plan.compensations:
        match status(compensation.compensation_id):
            case None:
                return _schedule(rollback_id, compensation)
            case "scheduled" if _lacks_its_call(now, compensation):
                # Recorded without its call: the service stopped between the two appends.
                return [_undo_call(rollback_id, compensation)]
            case "scheduled":
                return []  # Under way: its outcome decides what comes next.
            case _:
                pass
    completed = RollbackCompleted(
        rollback_id=rollback_id,
        checkpoint_id=rollback.checkpoint_id,
        undone_steps=_undone(plan, done),
        not_undone_steps=plan.blocking_steps,
    )
    return [Decision(completed, f"rollback/{rollback_id}/end")]


def _refusal(plan: RollbackPlan, rollback: RollbackState) -> RollbackRefused | None:
    if plan.problem is not None:
        return RollbackRefused(rollback_id=rollback.rollback_id, reason=plan.problem)
    if plan.blocking_steps and not rollback.accept_partial:
        listed = ", ".join(plan.blocking_steps)
        return RollbackRefused(
            rollback_id=rollback.rollback_id,
            reason=f"steps {listed} cannot be undone; accept a partial rollback to undo the rest",
            blocking_steps=plan.blocking_steps,
        )
    return None


def _undone(plan: RollbackPlan, done: tuple[Compensation, ...]) -> tuple[str, ...]:
    """Steps back where they were: those a completed compensation undid, and those that
    changed nothing outside the session (a failed call, a pure tool)."""
    needing = {step for c in plan.compensations for step in c.steps}
    undone = {step for c in done for step in c.steps}
    return tuple(
        step
        for step in plan.reset_steps
        if step not in plan.blocking_steps and (step in undone or step not in needing)
    )


def _schedule(rollback_id: str, compensation: Compensation) -> list[Decision]:
    identity = f"rollback/{rollback_id}/{compensation.compensation_id}"
    scheduled = Decision(compensation.scheduled(rollback_id), f"{identity}/scheduled")
    if compensation.kind == "inverse_tool":
        return [scheduled, _undo_call(rollback_id, compensation)]
    return [scheduled]


def _undo_call(rollback_id: str, compensation: Compensation) -> Decision:
    """The call of an inverse tool that a compensation makes."""
    assert compensation.tool is not None
    call = StepScheduled(
        step_id=compensation_step_id(compensation.step_id),
        call_id=compensation.compensation_id,
        tool=compensation.tool,
        arguments=compensation.arguments or {},
        compensation_id=compensation.compensation_id,
    )
    return Decision(call, f"rollback/{rollback_id}/{compensation.compensation_id}/call")


def _lacks_its_call(now: SessionState, compensation: Compensation) -> bool:
    return compensation.kind == "inverse_tool" and compensation.compensation_id not in now.calls


def call_outcome(plan: RollbackPlan, rollback: RollbackState, outcome: Payload) -> Decision | None:
    """The end of a compensation, when `outcome` ends the inverse call of one under way."""
    call_id = getattr(outcome, "call_id", None)
    if not rollback.active or rollback.compensations.get(call_id or "") != "scheduled":
        return None
    compensation = next(c for c in plan.compensations if c.compensation_id == call_id)
    ids = {
        "rollback_id": rollback.rollback_id,
        "compensation_id": compensation.compensation_id,
        "step_id": compensation.step_id,
    }
    payload: Payload
    match outcome:
        case ToolCallFailed():
            payload = CompensationFailed(**ids, error=outcome.error)
        case ToolCallDenied():
            payload = CompensationFailed(
                **ids, error=ToolError(kind="permission", message=outcome.reason)
            )
        case _:
            payload = CompensationCompleted(**ids)
    return Decision(payload, f"rollback/{rollback.rollback_id}/{call_id}/outcome")
