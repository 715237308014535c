"""What the planner decides, as pure functions of a session's state and the latest event."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from helmline.contracts import (
    Event,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    SessionCancelled,
    SessionCancelRequested,
    SessionCompleted,
    SessionFailed,
    SessionPaused,
    SessionPauseRequested,
    SessionResumed,
    SessionResumeRequested,
    SessionStarted,
    SessionState,
    StepAuthorized,
    StepRetryDeferred,
    StepScheduled,
    StepSkipped,
    StepState,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolCircuitChanged,
    WorkspaceRestored,
    critical_path_s,
)

MAX_ATTEMPTS = 3
"""Tries of a step whose failures are retryable."""

DONE = frozenset({"succeeded", "skipped"})
READY = frozenset({"pending", "undone"})
"""Statuses of steps that may be scheduled once their dependencies succeeded."""


@dataclass(frozen=True, slots=True)
class Decision:
    """An event to append, and what makes it unique when it must be stored once."""

    payload: Payload
    identity: str | None = None
    """Set for facts that must exist once whatever caused them (a step attempt scheduled)."""


def decide(state: SessionState, event: Event) -> list[Decision]:
    """The planner's reaction to `event`, given the session's state with `event` applied."""
    if state.is_terminal:
        return []
    data = event.data
    if _rolling_back(state) and not isinstance(data, SessionCancelRequested):
        return []  # Nothing starts while a rollback undoes steps; it ends paused.
    match data:
        case SessionStarted():
            return _plan(state, data)
        case PlanApproved() if data.revision == state.plan_revision:
            return _advance(state)
        case PlanRejected():
            return [
                Decision(SessionFailed(reason=f"plan rejected: {data.reason}"), _once(state, "end"))
            ]
        case ToolCallCompleted():
            return _advance(state, after=data.step_id)
        case ToolCallFailed():
            return _after_failure(state, data)
        case ToolCallDenied():
            return _after_denial(state, data)
        case SessionPauseRequested():
            return [] if state.status == "paused" else [Decision(SessionPaused())]
        case SessionResumeRequested():
            resumed = [] if state.status != "paused" else [Decision(SessionResumed())]
            return resumed + _advance(state)
        case SessionCancelRequested():
            return [
                Decision(SessionCancelled(reason=data.reason or "cancelled"), _once(state, "end"))
            ]
        case WorkspaceRestored():
            return _advance(state)  # A fork's workspace is ready.
        case _:
            return []


def _once(state: SessionState, fact: str) -> str:
    """The identity of a fact that happens once per course of the session: a rollback starts
    a new course, in which the session may end (or skip a step) again."""
    rolled_back = sum(1 for r in state.rollbacks.values() if r.status == "completed")
    return f"{fact}/after-rollback-{rolled_back}" if rolled_back else fact


def _rolling_back(state: SessionState) -> bool:
    return any(rollback.active for rollback in state.rollbacks.values())


def _waits_for_workspace(state: SessionState) -> bool:
    """A fork runs nothing before its workspace holds its origin's checkpoint."""
    origin = state.fork_of
    return origin is not None and origin.snapshot_id is not None and not state.latest_snapshot_id


def _plan(state: SessionState, started: SessionStarted) -> list[Decision]:
    if state.plan_revision:
        return []
    if started.playbook is None:
        reason = f"no planner for mode {started.mode!r} without a playbook is configured"
        return [Decision(SessionFailed(reason=reason), _once(state, "end"))]
    steps = started.playbook.steps
    proposal = PlanProposed(
        revision=1,
        steps=steps,
        reasoning="declared playbook",
        confidence=1.0,
        estimated_duration_s=critical_path_s(steps),
        permissions=tuple(sorted({step.tool for step in steps})),
    )
    return [Decision(proposal, "plan/1")]


def _advance(
    state: SessionState, skipped: frozenset[str] = frozenset(), after: str | None = None
) -> list[Decision]:
    """Schedule every step whose dependencies are done; end the session when all are.

    `skipped` names steps being skipped by decisions not yet in the state. `after` names a
    step that just succeeded: only its dependants can have become ready, and looking at them
    alone keeps a step's cost flat however long the plan is.
    """
    if state.plan_revision == 0 or state.plan_approved_revision < state.plan_revision:
        return []
    if _waits_for_workspace(state):
        return []
    decisions: list[Decision] = []
    skipping = set(skipped)
    candidates: Iterable[StepState] = state.steps.values()
    if after is not None:
        finished = state.steps.get(after)
        candidates = [state.steps[d] for d in finished.dependants] if finished else []
    for step in candidates:
        if step.status not in READY or step.id in skipping:
            continue
        blocked = [d for d in step.depends_on if _status(state, d, skipping) == "skipped"]
        if blocked:
            skipping.add(step.id)
            reason = f"depends on skipped step {blocked[0]!r}"
            decisions.append(
                Decision(
                    StepSkipped(step_id=step.id, reason=reason), _once(state, f"skip/{step.id}")
                )
            )
        elif not state.pause_requested and all(
            _status(state, d, skipping) == "succeeded" for d in step.depends_on
        ):
            # A step a rollback undid runs again as a new attempt (a new call).
            decisions.append(_schedule(state, step, attempt=step.attempts + 1))
    scheduled = any(isinstance(d.payload, StepScheduled) for d in decisions)
    if not scheduled and all(s.status in DONE or s.id in skipping for s in state.steps.values()):
        succeeded = sum(1 for s in state.steps.values() if s.status == "succeeded")
        summary = f"{succeeded} of {len(state.steps)} steps succeeded"
        decisions.append(Decision(SessionCompleted(summary=summary), _once(state, "end")))
    return decisions


def _status(state: SessionState, step_id: str, skipping: set[str]) -> str:
    if step_id in skipping:
        return "skipped"
    step = state.steps.get(step_id)
    return step.status if step else "missing"


def _schedule(state: SessionState, step: StepState, attempt: int) -> Decision:
    """The step's next attempt, saying so when its approved plan authorised the call (it
    then runs without a decision of its own)."""
    call: dict[str, Any] = {
        "step_id": step.id,
        "call_id": f"{step.id}.{attempt}",
        "attempt": attempt,
        "tool": step.tool,
        "arguments": step.arguments,
        "risk": step.risk,
        "requires_approval": step.requires_approval,
        "hosts": step.hosts,
        "taint": step.taint,
    }
    approval = state.plan_approval
    scheduled = (
        StepAuthorized(**call, authorized_by_plan=approval.revision)
        if approval is not None
        and not step.requires_approval
        and approval.authorization_of(step.id, step.tool, step.arguments) is not None
        else StepScheduled(**call)
    )
    return Decision(scheduled, f"step/{step.id}/{attempt}")


def _after_failure(state: SessionState, failed: ToolCallFailed) -> list[Decision]:
    step = state.steps.get(failed.step_id)
    if step is None or step.call_id != failed.call_id:
        return []
    if step.error is not None and step.error.retryable and step.attempts < MAX_ATTEMPTS:
        return [_schedule(state, step, attempt=step.attempts + 1)]
    reason = f"step {step.id!r} failed: {failed.error.message}"
    return [Decision(SessionFailed(reason=reason, step_id=step.id), _once(state, "end"))]


def retry_deferral(
    decisions: Iterable[Decision], failed: ToolCallFailed, circuit: ToolCircuitChanged | None
) -> StepRetryDeferred | None:
    """The retry among `decisions`, taken on `failed`, put off until it may succeed: until
    the time the failure names (a rate limit's window frees a slot), and until its server's
    breaker (as `circuit` last announced it) lets a probe through, whichever is later.
    Sooner, the call would fail at once without doing anything, spending one of the step's
    attempts for nothing. None: retry at once (or there is no retry).
    """
    retries = any(isinstance(d.payload, StepScheduled) and d.payload.attempt > 1 for d in decisions)
    if not retries:
        return None
    waits = []
    if failed.retry_at is not None:
        waits.append((failed.retry_at, failed.error.message))
    if circuit is not None and circuit.state == "open" and circuit.retry_at is not None:
        waits.append((circuit.retry_at, f"the circuit of MCP server {circuit.server} is open"))
    if not waits:
        return None
    retry_at, reason = max(waits)
    return StepRetryDeferred(
        step_id=failed.step_id, call_id=failed.call_id, retry_at=retry_at, reason=reason
    )


def _after_denial(state: SessionState, denied: ToolCallDenied) -> list[Decision]:
    step = state.steps.get(denied.step_id)
    if step is None or step.call_id != denied.call_id:
        return []
    if (step.on_denied or state.on_denied) == "fail":
        reason = f"step {step.id!r} was denied: {denied.reason}"
        return [Decision(SessionFailed(reason=reason, step_id=step.id), _once(state, "end"))]
    skip = Decision(
        StepSkipped(step_id=step.id, reason=f"denied: {denied.reason}"), f"skip/{step.id}"
    )
    return [skip, *_advance(state, frozenset({step.id}))]
