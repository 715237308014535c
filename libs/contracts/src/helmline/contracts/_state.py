"""The pure fold: a session's state is rebuilt from its events, and from nothing else.

`evolve` is total over the catalogue (the `match` ends in `assert_never`) and never raises:
an event that does not fit the state it meets (a result for a step never planned, a second
terminal event) is absorbed as well as it can be, because the log is the truth and a fold
that refuses part of it would hide facts. Every update copies; no state is ever mutated.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import reduce
from typing import Any, Literal, assert_never

from pydantic import Field, JsonValue

from helmline.contracts._catalogue import (
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    CheckpointCreated,
    CompensationCompleted,
    CompensationFailed,
    CompensationScheduled,
    ForkOrigin,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    RollbackRequested,
    SandboxExecutionRequested,
    SandboxLimitExceeded,
    SessionCancelled,
    SessionCancelRequested,
    SessionCompleted,
    SessionFailed,
    SessionPaused,
    SessionPauseRequested,
    SessionResumed,
    SessionResumeRequested,
    SessionStarted,
    StepScheduled,
    StepSkipped,
    ThoughtRecorded,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolCallStarted,
    WorkspaceRestored,
    WorkspaceSnapshotted,
)
from helmline.contracts._envelope import Event
from helmline.contracts._plans import PlanStep
from helmline.contracts._values import Actor, Arguments, Contract, LimitHit, Risk, ToolError

SessionStatus = Literal[
    "pending", "planning", "executing", "waiting", "paused", "completed", "failed", "cancelled"
]
"""Where a session is in its life; the last three are terminal."""

StepStatus = Literal[
    "pending",
    "scheduled",
    "authorized",
    "running",
    "succeeded",
    "failed",
    "denied",
    "skipped",
    "undone",
]
"""Where a step is in its life."""

TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})



class StepState(Contract):
    """One step of the session's plan and what became of it."""

    id: str
    """The step id."""
    description: str = ""
    """What the step is for."""
    tool: str = ""
    """The tool it calls."""
    arguments: Arguments = Field(default_factory=dict)
    """The arguments of the latest attempt."""
    depends_on: tuple[str, ...] = ()
    """Steps it waits for."""
    risk: Risk | None = None
    """Risk declared by the plan or decided by policy."""
    status: StepStatus = "pending"
    """Where the step is."""
    attempts: int = 0
    """How many times it was scheduled."""
    call_id: str | None = None
    """The tool call of the latest attempt."""
    approval_request_id: str | None = None
    """The approval request the step waits for or waited for."""
    output: JsonValue = None
    """The result of the latest successful call."""
    error: ToolError | None = None
    """The error of the latest failed call."""
    limit_hit: LimitHit | None = None
    """A resource limit the latest call hit."""
    reason: str | None = None
    """Why the step was denied or skipped."""
    scheduled_at: datetime | None = None
    """When the latest attempt was scheduled."""
    finished_at: datetime | None = None
    """When the latest attempt finished."""
    duration_ms: float | None = None
    """How long the latest call ran."""


class ApprovalState(Contract):
    """An approval request and its outcome."""

    request_id: str
    """The request id."""
    scope: Literal["plan", "step"]
    """What waits: a plan revision or a step."""
    step_id: str | None = None
    """The step, for step approvals."""
    call_id: str | None = None
    """The tool call, for step approvals."""
    tool: str | None = None
    """The tool to be called."""
    arguments: Arguments | None = None
    """The arguments requested."""
    risk: Risk
    """The risk that made approval necessary."""
    reason: str
    """Why approval is needed."""
    rule: str | None = None
    """The policy rule that asked."""
    approver_roles: tuple[str, ...] = ()
    """Roles allowed to decide."""
    quorum: int = 1
    """Distinct grants needed."""
    expires_at: datetime
    """When it turns into a denial."""
    status: Literal["pending", "granted", "denied", "expired"] = "pending"
    """The outcome so far."""
    votes: tuple[ApprovalDecisionSubmitted, ...] = ()
    """Decisions submitted so far, in order."""
    decided_by: tuple[Actor, ...] = ()
    """Who made the outcome."""
    comment: str = ""
    """The deciding comment."""
    modified_arguments: Arguments | None = None
    """Arguments the approvers substituted."""
    requested_at: datetime
    """When it was asked for."""
    decided_at: datetime | None = None
    """When it was decided or expired."""


class CheckpointState(Contract):
    """A point the session can be rolled back to."""

    checkpoint_id: str
    """The checkpoint id."""
    step_id: str
    """The step completed at that point."""
    at_seq: int
    """Stream sequence the checkpoint captures."""
    snapshot_id: str | None = None
    """Workspace snapshot, if any."""
    reversible: bool = True
    """Whether the step can be undone."""
    compensation: str | None = None
    """How it is undone, or why it cannot be."""
    created_at: datetime
    """When the checkpoint was made."""


class RollbackState(Contract):
    """A rollback and its progress."""

    rollback_id: str
    """The rollback id."""
    checkpoint_id: str
    """The checkpoint aimed for."""
    status: Literal["requested", "refused", "running", "completed", "failed"] = "requested"
    """Where the rollback is."""
    requested_by: Actor
    """Who asked."""
    accept_partial: bool = False
    """Whether irreversible steps may be left as they are."""
    compensations: dict[str, Literal["scheduled", "completed", "failed"]] = Field(
        default_factory=dict
    )
    """Each compensation and its status."""
    undone_steps: tuple[str, ...] = ()
    """Steps undone."""
    not_undone_steps: tuple[str, ...] = ()
    """Steps left as they were."""
    blocking_steps: tuple[str, ...] = ()
    """Irreversible steps that refused the rollback."""
    reason: str = ""
    """Why it was refused or failed."""


class ThoughtState(Contract):
    """A thought of the planner, as recorded."""

    kind: str
    """observation, reasoning, decision, action or reflection."""
    text: str
    """The thought."""
    confidence: float | None = None
    """How sure the planner was."""
    step_id: str | None = None
    """The step it concerns."""
    at: datetime
    """When it was recorded."""


class SessionState(Contract):
    """Everything known about a session, folded from its events."""

    session_id: str = ""
    """The session id."""
    tenant: str = ""
    """Its tenant."""
    status: SessionStatus = "pending"
    """Where the session is in its life."""
    goal: str = ""
    """The goal."""
    mode: Literal["playbook", "plan", "act"] = "playbook"
    """How it is planned."""
    requested_by: Actor | None = None
    """Who started it."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Its labels."""
    fork_of: ForkOrigin | None = None
    """The session and sequence it was forked from."""
    on_denied: Literal["fail", "continue"] = "fail"
    """The plan's default for denied steps."""
    plan_revision: int = 0
    """Latest proposed plan revision; 0 before any plan."""
    plan_approved_revision: int = 0
    """Latest approved plan revision; 0 before approval."""
    plan_confidence: float | None = None
    """Confidence of the latest plan."""
    plan_reasoning: str = ""
    """Reasoning behind the latest plan."""
    plan_rejection: str | None = None
    """Why the latest plan was rejected, if it was."""
    steps: dict[str, StepState] = Field(default_factory=dict)
    """Steps by id, in plan order."""
    calls: dict[str, str] = Field(default_factory=dict)
    """Step id of every tool call ever scheduled, by call id."""
    approvals: dict[str, ApprovalState] = Field(default_factory=dict)
    """Approval requests by id."""
    checkpoints: tuple[CheckpointState, ...] = ()
    """Checkpoints in the order they were made."""
    rollbacks: dict[str, RollbackState] = Field(default_factory=dict)
    """Rollbacks by id."""
    thoughts: tuple[ThoughtState, ...] = ()
    """The planner's thoughts in order."""
    latest_snapshot_id: str | None = None
    """The newest workspace snapshot."""
    pause_requested: bool = False
    """A pause was asked for and not yet resumed."""
    cancel_requested: bool = False
    """A cancel was asked for."""
    outcome: str = ""
    """Summary on completion, reason on failure or cancellation."""
    partial: bool = False
    """Whether a completed session met only some of its criteria."""
    started_at: datetime | None = None
    """When the session started."""
    ended_at: datetime | None = None
    """When it reached a terminal status."""
    updated_at: datetime | None = None
    """Time of the latest event."""
    event_count: int = 0
    """How many events were folded."""

    @property
    def is_terminal(self) -> bool:
        """Whether the session has ended."""
        return self.status in TERMINAL_STATUSES

    @property
    def pending_approvals(self) -> tuple[ApprovalState, ...]:
        """Approval requests still waiting for a decision."""
        return tuple(a for a in self.approvals.values() if a.status == "pending")


def fold(events: Iterable[Event], state: SessionState | None = None) -> SessionState:
    """The state after applying `events`, in order, to `state` (or to a new session)."""
    return reduce(evolve, events, state or SessionState())


def evolve(state: SessionState, event: Event) -> SessionState:
    """The state after one more event. Pure, total and deterministic."""
    changes = _changes(state, event)
    changes["event_count"] = state.event_count + 1
    changes["updated_at"] = event.time
    if not state.session_id:
        changes.setdefault("session_id", event.session_id)
        changes.setdefault("tenant", event.tenant)
    return state.model_copy(update=changes)


def _changes(state: SessionState, event: Event) -> dict[str, Any]:  # noqa: C901 - one arm per type
    data = event.data
    match data:
        case SessionStarted():
            return {
                "status": "planning" if state.status == "pending" else state.status,
                "goal": data.goal,
                "mode": data.mode,
                "requested_by": data.requested_by,
                "labels": data.labels,
                "fork_of": data.fork_of,
                "on_denied": data.playbook.on_denied if data.playbook else state.on_denied,
                "started_at": state.started_at or event.time,
            }
        case SessionPauseRequested():
            return {"pause_requested": True}
        case SessionPaused():
            return _status(state, "paused")
        case SessionResumeRequested():
            return {"pause_requested": False}
        case SessionResumed():
            return {"pause_requested": False, **_status(state, _active_status(state))}
        case SessionCancelRequested():
            return {"cancel_requested": True}
        case SessionCancelled():
            return {**_ended(state, event, "cancelled"), "outcome": data.reason}
        case SessionCompleted():
            return {**_ended(state, event, "completed"), "outcome": data.summary,
                    "partial": data.partial}
        case SessionFailed():
            return {**_ended(state, event, "failed"), "outcome": data.reason}
        case ThoughtRecorded():
            thought = ThoughtState(kind=data.kind, text=data.text, confidence=data.confidence,
                                   step_id=data.step_id, at=event.time)
            return {"thoughts": (*state.thoughts, thought)}
        case PlanProposed():
            return {
                "plan_revision": data.revision,
                "plan_confidence": data.confidence,
                "plan_reasoning": data.reasoning,
                "plan_rejection": None,
                "steps": _planned_steps(state.steps, data.steps),
                **_status(state, "planning"),
            }
        case PlanApproved():
            return {"plan_approved_revision": data.revision, **_status(state, "executing")}
        case PlanRejected():
            return {"plan_rejection": data.reason}
        case ApprovalRequested():
            approval = ApprovalState(
                request_id=data.request_id, scope=data.scope, step_id=data.step_id,
                call_id=data.call_id, tool=data.tool, arguments=data.arguments, risk=data.risk,
                reason=data.reason, rule=data.rule, approver_roles=data.approver_roles,
                quorum=data.quorum, expires_at=data.expires_at, requested_at=event.time,
            )
            changes = {"approvals": {**state.approvals, data.request_id: approval},
                       **_status(state, "waiting")}
            if data.step_id is not None:
                changes["steps"] = _step(state, data.step_id,
                                         approval_request_id=data.request_id)
            return changes
        case ApprovalDecisionSubmitted():
            request = state.approvals.get(data.request_id)
            if request is None:
                return {}
            updated = request.model_copy(update={"votes": (*request.votes, data)})
            return {"approvals": {**state.approvals, data.request_id: updated}}
        case ApprovalGranted():
            return _decided(state, event, data.request_id, "granted", data.decided_by,
                            data.comment, data.modified_arguments)
        case ApprovalDenied():
            return _decided(state, event, data.request_id, "denied", (data.decided_by,),
                            data.comment, None)
        case ApprovalExpired():
            return _decided(state, event, data.request_id, "expired", (), "", None)
        case StepScheduled():
            previous = state.steps.get(data.step_id)
            steps = _step(
                state, data.step_id, tool=data.tool, arguments=data.arguments,
                risk=data.risk if data.risk is not None else previous and previous.risk,
                status="scheduled", attempts=data.attempt, call_id=data.call_id,
                output=None, error=None, limit_hit=None, reason=None,
                scheduled_at=event.time, finished_at=None, duration_ms=None,
            )
            return {"steps": steps, "calls": {**state.calls, data.call_id: data.step_id},
                    **_status(state, "executing" if state.status == "planning"
                              else state.status)}
        case StepSkipped():
            return {"steps": _step(state, data.step_id, status="skipped", reason=data.reason,
                                   finished_at=event.time)}
        case ToolCallAuthorized():
            return _call(state, data.call_id, data.step_id, status="authorized",
                         arguments=data.arguments, risk=data.risk)
        case ToolCallDenied():
            return _call(state, data.call_id, data.step_id, status="denied",
                         reason=data.reason, finished_at=event.time)
        case ToolCallStarted():
            return _call(state, data.call_id, data.step_id, status="running")
        case ToolCallCompleted():
            return _call(state, data.call_id, data.step_id, status="succeeded",
                         output=data.output, error=None, finished_at=event.time,
                         duration_ms=data.duration_ms)
        case ToolCallFailed():
            return _call(state, data.call_id, data.step_id, status="failed",
                         error=data.error, finished_at=event.time,
                         duration_ms=data.duration_ms)
        case SandboxExecutionRequested():
            return {}
        case SandboxLimitExceeded():
            return _call(state, data.call_id, data.step_id, limit_hit=data.hit)
        case WorkspaceSnapshotted():
            return {"latest_snapshot_id": data.snapshot_id}
        case WorkspaceRestored():
            return {"latest_snapshot_id": data.snapshot_id}
        case CheckpointCreated():
            checkpoint = CheckpointState(
                checkpoint_id=data.checkpoint_id, step_id=data.step_id, at_seq=data.at_seq,
                snapshot_id=data.snapshot_id, reversible=data.reversible,
                compensation=data.compensation, created_at=event.time,
            )
            return {"checkpoints": (*state.checkpoints, checkpoint)}
        case RollbackRequested():
            rollback = RollbackState(rollback_id=data.rollback_id,
                                     checkpoint_id=data.checkpoint_id,
                                     requested_by=data.requested_by,
                                     accept_partial=data.accept_partial, reason=data.reason)
            return {"rollbacks": {**state.rollbacks, data.rollback_id: rollback}}
        case RollbackRefused():
            return _rollback(state, data.rollback_id, status="refused", reason=data.reason,
                             blocking_steps=data.blocking_steps)
        case CompensationScheduled():
            return _compensation(state, data.rollback_id, data.compensation_id, "scheduled")
        case CompensationCompleted():
            changes = _compensation(state, data.rollback_id, data.compensation_id, "completed")
            changes["steps"] = _step(state, data.step_id, status="undone")
            return changes
        case CompensationFailed():
            return _compensation(state, data.rollback_id, data.compensation_id, "failed")
        case RollbackCompleted():
            return {
                **_rollback(state, data.rollback_id, status="completed",
                            undone_steps=data.undone_steps),
                "checkpoints": _checkpoints_up_to(state, data.checkpoint_id),
                # A rolled-back session waits for a person to resume or replan it.
                "status": "paused", "ended_at": None, "outcome": "",
            }
        case RollbackFailed():
            return _rollback(state, data.rollback_id, status="failed", reason=data.reason,
                             undone_steps=data.undone_steps,
                             not_undone_steps=data.not_undone_steps)
        case _:
            assert_never(data)


def _status(state: SessionState, status: SessionStatus) -> dict[str, Any]:
    # A terminal status is final; later events are recorded but do not reopen the session.
    return {} if state.is_terminal else {"status": status}


def _active_status(state: SessionState) -> SessionStatus:
    return "waiting" if state.pending_approvals else "executing"


def _ended(state: SessionState, event: Event, status: SessionStatus) -> dict[str, Any]:
    if state.is_terminal:
        return {}
    return {"status": status, "ended_at": event.time}


def _planned_steps(
    current: dict[str, StepState], planned: tuple[PlanStep, ...]
) -> dict[str, StepState]:
    # A replan keeps what finished steps achieved and lays out the rest afresh.
    steps: dict[str, StepState] = {}
    for step in planned:
        known = current.get(step.id)
        if known is not None and known.status == "succeeded":
            steps[step.id] = known
            continue
        steps[step.id] = StepState(id=step.id, description=step.description, tool=step.tool,
                                   arguments=step.arguments, depends_on=step.depends_on,
                                   risk=step.risk)
    for step_id, known in current.items():
        steps.setdefault(step_id, known)
    return steps


def _step(state: SessionState, step_id: str, **changes: Any) -> dict[str, StepState]:
    step = state.steps.get(step_id) or StepState(id=step_id)
    return {**state.steps, step_id: step.model_copy(update=changes)}


def _call(state: SessionState, call_id: str, step_id: str, **changes: Any) -> dict[str, Any]:
    step = state.steps.get(step_id)
    # Events of an attempt that a newer attempt replaced only update the record of calls.
    if step is not None and step.call_id not in (None, call_id):
        return {"calls": {**state.calls, call_id: step_id}}
    return {"steps": _step(state, step_id, call_id=call_id, **changes),
            "calls": {**state.calls, call_id: step_id}}


def _decided(
    state: SessionState,
    event: Event,
    request_id: str,
    status: Literal["granted", "denied", "expired"],
    decided_by: tuple[Actor, ...],
    comment: str,
    modified_arguments: Arguments | None,
) -> dict[str, Any]:
    request = state.approvals.get(request_id)
    if request is None or request.status != "pending":
        return {}
    decided = request.model_copy(update={
        "status": status, "decided_by": decided_by, "comment": comment,
        "modified_arguments": modified_arguments, "decided_at": event.time,
    })
    approvals = {**state.approvals, request_id: decided}
    still_waiting = any(a.status == "pending" for a in approvals.values())
    changes: dict[str, Any] = {"approvals": approvals}
    if state.status == "waiting" and not still_waiting:
        changes["status"] = "paused" if state.pause_requested else "executing"
    return changes


def _rollback(state: SessionState, rollback_id: str, **changes: Any) -> dict[str, Any]:
    rollback = state.rollbacks.get(rollback_id)
    if rollback is None:
        return {}
    return {"rollbacks": {**state.rollbacks, rollback_id: rollback.model_copy(update=changes)}}


def _compensation(
    state: SessionState,
    rollback_id: str,
    compensation_id: str,
    status: Literal["scheduled", "completed", "failed"],
) -> dict[str, Any]:
    rollback = state.rollbacks.get(rollback_id)
    if rollback is None:
        return {}
    compensations = {**rollback.compensations, compensation_id: status}
    return _rollback(state, rollback_id, status="running", compensations=compensations)


def _checkpoints_up_to(state: SessionState, checkpoint_id: str) -> tuple[CheckpointState, ...]:
    for index, checkpoint in enumerate(state.checkpoints):
        if checkpoint.checkpoint_id == checkpoint_id:
            return state.checkpoints[: index + 1]
    return state.checkpoints
