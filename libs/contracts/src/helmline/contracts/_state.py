"""The pure fold: a session's state is rebuilt from its events, and from nothing else.

`fold` is total over the catalogue (each payload class has its reducer in `REDUCERS`, and a
test fails for a class without one) and never raises: an
event that does not fit the state it meets (a result for a step never planned, a second
terminal event) is absorbed as well as it can be, because the log is the truth and a fold
that refuses part of it would hide facts.

States are frozen and never change once returned. What grows with a session is persistent:
its steps, calls, approval requests, rollbacks and unrestorable snapshots are `Table`s, its
checkpoints and thoughts `Vector`s. A state one event later shares all but what changed with
the state before, so folding one more event (`evolve`) costs the same in a session of
10,000 steps as in one of 200.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, TypeVar, get_args

from pydantic import JsonValue

from helmline.contracts._envelope import Event
from helmline.contracts._exchanges import CriterionResult
from helmline.contracts._payload import Payload
from helmline.contracts._plans import PlanStep
from helmline.contracts._tables import Table, Vector
from helmline.contracts._taint import CallTaint
from helmline.contracts._tools import ToolEffect
from helmline.contracts._topology import SESSIONLESS_CHANNELS
from helmline.contracts._values import (
    Actor,
    ArgumentCondition,
    Arguments,
    FileChanges,
    LimitHit,
    Risk,
    ToolError,
)
from helmline.contracts.events import (
    Alternative,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalVoteCounted,
    CheckpointCreated,
    CompensationCompleted,
    CompensationFailed,
    CompensationScheduled,
    ContextCompacted,
    ForkOrigin,
    GrantScope,
    InverseCall,
    LoopDetected,
    ModelExchangeRecorded,
    PermissionKind,
    PermissionNeed,
    PermissionRequested,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    RollbackRequested,
    SandboxExecutionRequested,
    SandboxLimitApproached,
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
    StepAuthorized,
    StepRetryDeferred,
    StepScheduled,
    StepSkipped,
    ThoughtRecorded,
    ToolCallAttemptFailed,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolCallStarted,
    WorkspaceRestored,
    WorkspaceSnapshotsPruned,
    WorkspaceSnapshotted,
)

PermissionKey = tuple[PermissionKind, str]
"""A permission as the policy compares it: its kind and name (`("network", "api.example.com")`)."""

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

IN_FLIGHT_STEPS: frozenset[StepStatus] = frozenset({"scheduled", "authorized", "running"})
"""Statuses of a step whose call may still run (or is still being decided on)."""

FOLD_VERSION = 5
"""Bump whenever the fold yields a different state for the same events: folded states stored
by another version are then ignored (the field layout is checked on its own)."""

TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
"""Statuses a session never leaves (except through a rollback)."""
OPEN_STATUSES: tuple[SessionStatus, ...] = tuple(
    status for status in get_args(SessionStatus) if status not in TERMINAL_STATUSES
)
"""The statuses of a session that has not ended, in the order of its life."""


CallProgress = Literal["not started", "started", "finished"]
"""How far a tool call got, as a session's state tells it (`SessionState.call_progress`)."""

_PROGRESS_OF_STEP: dict[StepStatus, CallProgress] = {
    "running": "started",
    "succeeded": "finished",
    "failed": "finished",
    "undone": "finished",
    "skipped": "finished",
    "denied": "finished",
}
"""What a step's status says of its current call (other statuses: not started)."""


@dataclass(frozen=True, slots=True)
class StepState:
    """One step of the session's plan and what became of it."""

    id: str
    """The step id."""
    description: str = ""
    """What the step is for."""
    tool: str = ""
    """The tool it calls."""
    arguments: Arguments = field(default_factory=dict)
    """The arguments of the latest attempt."""
    depends_on: tuple[str, ...] = ()
    """Steps it waits for."""
    dependants: tuple[str, ...] = ()
    """Steps of the plan that wait for it: the only ones its success can make ready."""
    risk: Risk | None = None
    """Risk declared by the plan or decided by policy."""
    requires_approval: bool = False
    """Whether the plan asks a person to approve the step."""
    estimated_duration_s: float | None = None
    """How long the plan expects the step to take."""
    on_denied: Literal["fail", "continue"] | None = None
    """What the plan said to do if this step is denied; None follows the session default."""
    hosts: tuple[str, ...] = ()
    """Network hosts the plan says the step's call reaches."""
    taint: CallTaint | None = None
    """What untrusted content the model had read when it proposed the step."""
    status: StepStatus = "pending"
    """Where the step is."""
    attempts: int = 0
    """How many times it was scheduled."""
    retries: int = 0
    """Tries of the latest call that failed and that the gateway made again."""
    call_id: str | None = None
    """The tool call of the latest attempt."""
    approval_request_id: str | None = None
    """The approval request the step waits or waited for."""
    output: JsonValue = None
    """The result of the latest successful call."""
    cached_from: str | None = None
    """The earlier call whose result the latest call reused (its tool is pure, and the
    session called it before with the same arguments), if it did."""
    error: ToolError | None = None
    """The error of the latest failed call."""
    redacted_by: dict[str, int] = field(default_factory=dict[str, int])
    """What output safety redacted from the latest call's result or error, by rule (a
    registered secret's rule is `secret:NAME`): never the values."""
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
    retry_at: datetime | None = None
    """When the failed step is tried again, if its next attempt waits (its server's circuit
    breaker is open)."""


@dataclass(frozen=True, slots=True)
class ApprovalState:
    """An approval request and its outcome."""

    request_id: str
    """The request id."""
    scope: Literal["plan", "step"]
    """What waits: a plan revision or a step."""
    risk: Risk
    """The risk that made approval necessary."""
    reason: str
    """Why approval is needed."""
    expires_at: datetime
    """When it turns into a denial."""
    requested_at: datetime
    """When it was asked for."""
    step_id: str | None = None
    """The step, for step approvals."""
    call_id: str | None = None
    """The tool call, for step approvals."""
    tool: str | None = None
    """The tool to be called."""
    arguments: Arguments | None = None
    """The arguments requested."""
    taint: CallTaint | None = None
    """What untrusted content the call may owe its arguments to: the sources to show."""
    rule: str | None = None
    """The policy rule that asked."""
    approver_roles: tuple[str, ...] = ()
    """Roles allowed to decide."""
    quorum: int = 1
    """Distinct grants needed."""
    status: Literal["pending", "granted", "denied", "expired", "withdrawn"] = "pending"
    """The outcome so far; `withdrawn` when the session ended before anyone decided (a
    decision then is refused: nothing of the session's plan runs any more)."""
    votes: tuple[ApprovalDecisionSubmitted, ...] = ()
    """Decisions submitted so far, in order."""
    decided_by: tuple[Actor, ...] = ()
    """Who made the outcome."""
    comment: str = ""
    """The deciding comment."""
    modified_arguments: Arguments | None = None
    """Arguments the approvers substituted."""
    decided_at: datetime | None = None
    """When it was decided or expired."""
    similar_limit: int | None = None
    """How many later similar calls the grant also approves; None for this call only."""
    similar_until: datetime | None = None
    """When that standing grant ends."""
    similar_where: dict[str, ArgumentCondition] | None = None
    """Conditions on the later calls' arguments that the standing grant is limited to."""
    similar_used: int = 0
    """Later calls authorised under the standing grant so far."""
    definition_digest: str | None = None
    """For a step approval of an MCP tool, the digest of the tool's definition when asked:
    the grant holds for that definition only."""
    permissions: tuple[PermissionNeed, ...] = ()
    """For a permission request (`permission.requested`): what the call lacks; empty for
    other requests."""
    grant_scope: GrantScope | None = None
    """For a granted permission request: the step that asked, or the whole session."""
    grant_until: datetime | None = None
    """For a granted permission request: when the permissions granted end."""

    def grants(self, step_id: str, at: datetime) -> bool:
        """Whether this is a permission request whose grant holds at `at` for a call of the
        step `step_id`: granted, not yet ended, and for the session or for that step."""
        return (
            bool(self.permissions)
            and self.status == "granted"
            and (self.grant_until is None or at < self.grant_until)
            and (self.grant_scope == "session" or self.step_id == step_id)
        )


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """A point the session can be rolled back to."""

    checkpoint_id: str
    """The checkpoint id."""
    step_id: str
    """The step completed at that point."""
    at_seq: int
    """Stream sequence the checkpoint captures."""
    created_at: datetime
    """When the checkpoint was made."""
    snapshot_id: str | None = None
    """Workspace snapshot, if any."""
    reversible: bool = True
    """Whether the step can be undone."""
    compensation: str | None = None
    """How it is undone, or why it cannot be."""
    call_id: str | None = None
    """The call that completed the step."""
    tool: str | None = None
    """The tool the step called."""
    effect: ToolEffect | None = None
    """What the call changed: nothing, the workspace, or something outside Helmline."""
    inverse: InverseCall | None = None
    """The call that undoes the step, for a tool with a declared inverse."""
    changes: FileChanges | None = None
    """What the step changed in the workspace, when the sandbox ran it."""


@dataclass(frozen=True, slots=True)
class RollbackState:
    """A rollback and its progress."""

    rollback_id: str
    """The rollback id."""
    checkpoint_id: str
    """The checkpoint aimed for."""
    requested_by: Actor
    """Who asked."""
    status: Literal["requested", "refused", "running", "completed", "failed"] = "requested"
    """Where the rollback is."""
    accept_partial: bool = False
    """Whether irreversible steps may be left as they are."""
    compensations: dict[str, Literal["scheduled", "completed", "failed"]] = field(
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
    """Why it was requested, refused or failed."""

    @property
    def active(self) -> bool:
        """Whether it is still under way (no new step may start meanwhile)."""
        return self.status in ("requested", "running")


@dataclass(frozen=True, slots=True)
class ThoughtState:
    """A thought of the planner, as recorded."""

    kind: str
    """observation, reasoning, decision, action or reflection."""
    text: str
    """The thought."""
    at: datetime
    """When it was recorded."""
    confidence: float | None = None
    """How sure the planner was."""
    step_id: str | None = None
    """The step it concerns."""
    alternatives: tuple[Alternative, ...] = ()
    """Options it set aside, with why."""


@dataclass(frozen=True, slots=True)
class ModelTally:
    """What a session's calls of one model used."""

    model: str
    """The model, as named in its requests."""
    calls: int = 0
    """Model exchanges recorded with it."""
    input_tokens: int = 0
    """Tokens of their prompts."""
    output_tokens: int = 0
    """Tokens of their replies."""
    cost_usd: float = 0.0
    """What they cost, where a price is configured."""


def _tallied(
    tallies: tuple[ModelTally, ...], exchange: ModelExchangeRecorded
) -> tuple[ModelTally, ...]:
    """The tallies with one more exchange counted against its model (a session asks few)."""
    model, usage = exchange.request.model, exchange.reply.usage
    index = next((i for i, tally in enumerate(tallies) if tally.model == model), len(tallies))
    before = tallies[index] if index < len(tallies) else ModelTally(model)
    after = ModelTally(
        model,
        before.calls + 1,
        before.input_tokens + usage.input_tokens,
        before.output_tokens + usage.output_tokens,
        before.cost_usd + (exchange.cost_usd or 0.0),
    )
    return (*tallies[:index], after, *tallies[index + 1 :])


_NOTHING_YET: Vector[Any] = Vector()
"""The checkpoints and thoughts of a new session: a default, not a factory, so that the
state's JSON Schema shows it (as `[]`)."""


@dataclass(frozen=True, slots=True)
class SessionState:
    """Everything known about a session, folded from its events. Never mutate its containers."""

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
    labels: dict[str, str] = field(default_factory=dict)
    """Its labels."""
    fork_of: ForkOrigin | None = None
    """The session and sequence it was forked from."""
    on_denied: Literal["fail", "continue"] = "fail"
    """The plan's default for denied steps."""
    plan_revision: int = 0
    """Latest proposed plan revision; 0 before any plan."""
    plan_approved_revision: int = 0
    """Latest approved plan revision; 0 before approval."""
    plan_approval: PlanApproved | None = None
    """The approval of the plan in force, with the steps it authorised; None while a
    revision waits for one."""
    plan_confidence: float | None = None
    """Confidence of the latest plan."""
    plan_estimated_duration_s: float | None = None
    """How long the latest plan expects to take, when all its steps have estimates."""
    plan_permissions: tuple[str, ...] = ()
    """What the latest plan needs, as it declared it."""
    plan_reasoning: str = ""
    """Reasoning behind the latest plan."""
    plan_rejection: str | None = None
    """Why the latest plan was rejected, if it was."""
    steps: Table[str, StepState] = field(default_factory=Table)
    """Steps by id, in plan order."""
    calls: Table[str, str] = field(default_factory=Table)
    """Step id of every tool call ever scheduled, by call id."""
    approvals: Table[str, ApprovalState] = field(default_factory=Table)
    """Approval requests by id."""
    checkpoints: Vector[CheckpointState] = _NOTHING_YET
    """Checkpoints in the order they were made."""
    rollbacks: Table[str, RollbackState] = field(default_factory=Table)
    """Rollbacks by id."""
    thoughts: Vector[ThoughtState] = _NOTHING_YET
    """The planner's thoughts in order."""
    latest_snapshot_id: str | None = None
    """The newest workspace snapshot."""
    latest_snapshot_call_id: str | None = None
    """The call after which the newest snapshot was taken (None: before any, or restored)."""
    latest_snapshot_changes: FileChanges | None = None
    """What that call changed in the workspace."""
    initial_snapshot_id: str | None = None
    """The workspace before the session first changed it (the sandbox's first snapshot)."""
    unrestorable_snapshots: Table[str, str] = field(default_factory=Table)
    """Snapshots whose contents were not stored, with why: the workspace cannot return to
    them."""
    pause_requested: bool = False
    """A pause was asked for and not yet resumed."""
    cancel_requested: bool = False
    """A cancel was asked for."""
    outcome: str = ""
    """Summary on completion, reason on failure or cancellation."""
    partial: bool = False
    """Whether a completed session met only some of its criteria."""
    completion_criteria: tuple[str, ...] = ()
    """What must hold for the goal to be met, as the latest plan declared it."""
    criteria_required: int | None = None
    """How many of them must be met; all when None."""
    criteria: tuple[CriterionResult, ...] = ()
    """The completion criteria as checked when the session completed."""
    model_calls: int = 0
    """Model exchanges recorded (goal sessions)."""
    tokens_used: int = 0
    """Input and output tokens of every model call."""
    cost_usd: float = 0.0
    """What the model calls cost, where a price is configured."""
    model_usage: tuple[ModelTally, ...] = ()
    """Calls, tokens and cost by model (planning, summarising, classifying may differ), in
    the order the models were first asked."""
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

    @property
    def held_grants(self) -> tuple[ApprovalState, ...]:
        """Requests granted while the session was paused, whose calls wait for it to resume:
        granted, and the plan step's call still where it was scheduled."""
        return tuple(
            request
            for request in self.approvals.values()
            if request.status == "granted"
            and request.tool
            and (step := self.plan_step_of(request)) is not None
            and step.status == "scheduled"
            # Not a permission grant whose call was judged again and now waits for approval.
            and step.approval_request_id == request.request_id
        )

    def granted_permissions(self, step_id: str, at: datetime) -> frozenset[PermissionKey]:
        """The permissions people granted on request that hold at `at` for a call of the
        step `step_id` (see `ApprovalState.grants`): what the policy counts as held, besides
        the requester's own."""
        return frozenset(
            (need.kind, need.name)
            for request in self.approvals.values()
            if request.grants(step_id, at)
            for need in request.permissions
        )

    def plan_step_of(self, request: ApprovalState) -> StepState | None:
        """The step of the plan whose current call `request` asks about, if it asks about
        one. A rollback's undo call is no step of the plan: the rollback runs while the
        session is paused, so a pause does not hold it."""
        step = self.steps.get(request.step_id) if request.step_id is not None else None
        if step is None or request.call_id is None or step.call_id != request.call_id:
            return None
        return step

    def call_progress(self, call_id: str) -> CallProgress:
        """How far the tool call `call_id` got, for a service handed it again (a redelivery:
        it may have run it before). `finished`: it has an outcome, or is not to run any more
        (its step was skipped or denied, or a newer attempt replaced it); `started`: it was
        sent, or may have been; else `not started`.

        An undo call of a rollback is known only by its compensation, whose end says the
        call finished and nothing says it began: until then it may have, so it counts as
        started (a tool not declared idempotent is then not sent again)."""
        step_id = self.calls.get(call_id)
        if step_id is None:
            return "not started"
        step = self.steps.get(step_id)
        if step is not None and step.call_id == call_id:
            return _PROGRESS_OF_STEP.get(step.status, "not started")
        for rollback in self.rollbacks.values():
            compensation = rollback.compensations.get(call_id)
            if compensation is not None:
                return "started" if compensation == "scheduled" else "finished"
        return "finished" if step is not None and step.call_id is not None else "not started"

    def fork_refusal(self, checkpoint: CheckpointState) -> str | None:
        """Why no fork can start from `checkpoint`, if none can: no workspace can be as it
        was there any more (its snapshot was pruned, or never stored)."""
        lost = self.unrestorable_snapshots.get(checkpoint.snapshot_id or "")
        if lost is None:
            return None
        return (
            f"the workspace at checkpoint {checkpoint.checkpoint_id} is not kept ({lost}): "
            "fork from a later checkpoint"
        )


def fold(events: Iterable[Event], state: SessionState | None = None) -> SessionState:
    """The state after applying `events`, in order, to `state` (or to a new session)."""
    folding = SessionFold(state)
    for event in events:
        folding.apply(event)
    return folding.state()


def authorizations(events: Iterable[Event]) -> Iterator[tuple[Event, ToolCallAuthorized]]:
    """Each call authorised among a session's `events` (oldest first), with the event that
    authorised it: a `tool.call.authorized`, or a step scheduled as its approved plan
    authorised it (`StepScheduled.authorized_by`), which is the same decision."""
    approval: PlanApproved | None = None
    for event in events:
        match event.data:
            case ToolCallAuthorized() as decided:
                yield event, decided
            case PlanApproved() as approval:
                pass
            case StepScheduled(authorized_by_plan=int()) as scheduled if approval is not None:
                by_plan = scheduled.authorized_by(approval)
                if by_plan is not None:
                    yield event, by_plan
            case _:
                pass


def evolve(state: SessionState, event: Event) -> SessionState:
    """The state after one more event. Pure, total and deterministic."""
    return fold((event,), state)


Record = TypeVar("Record", "StepState", "ApprovalState", "RollbackState")


def _copy_with(record: Record, **changes: Any) -> Record:
    """A copy of a frozen record with some fields changed.

    Does what `dataclasses.replace` does at a third of the cost, which matters because a
    replay updates a step record for most events it folds.
    """
    copy = object.__new__(type(record))
    for name in record.__slots__:
        object.__setattr__(copy, name, changes[name] if name in changes else getattr(record, name))
    return copy


_STATE_FIELDS = tuple(f.name for f in fields(SessionState))
"""Read once: `fields()` builds its answer anew at every call, a third of a fold's time."""


class SessionFold:
    """A fold in progress: events are applied one by one.

    For replaying a stream without keeping its events: apply each as it arrives, then take
    `state()`. The starting state is never changed: each write makes a new table or vector
    that shares the rest with the one before.
    """

    __slots__ = (
        "approvals",
        "calls",
        "checkpoints",
        "fresh_steps",
        "rollbacks",
        "steps",
        "thoughts",
        "v",
    )

    def __init__(self, state: SessionState | None = None) -> None:
        state = state or SessionState()
        # Scalars (and the tables only rarely written to) live in `v`.
        self.v: dict[str, Any] = {name: getattr(state, name) for name in _STATE_FIELDS}
        self.steps: Table[str, StepState] = state.steps
        self.calls: Table[str, str] = state.calls
        self.approvals: Table[str, ApprovalState] = state.approvals
        self.rollbacks: Table[str, RollbackState] = state.rollbacks
        self.checkpoints: Vector[CheckpointState] = state.checkpoints
        self.thoughts: Vector[ThoughtState] = state.thoughts
        # Step records this fold made since it last handed out a state: no state holds
        # them, so they are changed in place (a replay updates each step four times or so).
        self.fresh_steps: set[str] = set()

    def state(self) -> SessionState:
        """The state after every event applied so far: cheap to take after every event, as
        the tables are shared, not copied."""
        self.fresh_steps = set()
        return SessionState(
            **{
                **self.v,
                "steps": self.steps,
                "calls": self.calls,
                "approvals": self.approvals,
                "rollbacks": self.rollbacks,
                "checkpoints": self.checkpoints,
                "thoughts": self.thoughts,
            }
        )

    @property
    def terminal(self) -> bool:
        return self.v["status"] in TERMINAL_STATUSES

    def set_status(self, status: SessionStatus) -> None:
        # A terminal status is final; later events are recorded but do not reopen the session.
        if not self.terminal:
            self.v["status"] = status

    def end(self, status: SessionStatus, event: Event) -> None:
        if not self.terminal:
            self.v["status"] = status
            self.v["ended_at"] = event.time
            comment = f"the session ended ({status}) before anyone decided"
            for request in [a for a in self.approvals.values() if a.status == "pending"]:
                _decided(self, event, request.request_id, "withdrawn", comment=comment)

    def update_step(self, step_id: str, **changes: Any) -> None:
        step = self.steps.get(step_id)
        if step is not None and step_id in self.fresh_steps:
            for name, value in changes.items():
                object.__setattr__(step, name, value)
            return
        self.steps = self.steps.set(step_id, _copy_with(step or StepState(id=step_id), **changes))
        self.fresh_steps.add(step_id)

    def set_approval(self, request: ApprovalState) -> None:
        """The one way an approval fact enters the state: only the reducers of the
        approvals' section below call it."""
        self.approvals = self.approvals.set(request.request_id, request)

    def set_rollback(self, rollback: RollbackState) -> None:
        self.rollbacks = self.rollbacks.set(rollback.rollback_id, rollback)

    def update_call(self, call_id: str, step_id: str, **changes: Any) -> None:
        if self.calls.get(call_id) != step_id:
            self.calls = self.calls.set(call_id, step_id)
        step = self.steps.get(step_id)
        if step is None and self.compensates(call_id):
            return  # A rollback's undo call: recorded in the rollback, not a step of the plan.
        # Events of an attempt that a newer attempt replaced only update the record of calls.
        if step is None or step.call_id in (None, call_id):
            self.update_step(step_id, call_id=call_id, **changes)

    def apply(self, event: Event) -> None:
        """Apply one more event: its payload's reducer (see `REDUCERS`) changes the state."""
        v = self.v
        v["event_count"] += 1
        v["updated_at"] = event.time
        if not v["session_id"]:
            v["session_id"] = event.session_id
            v["tenant"] = event.tenant
        REDUCERS[type(event.data)](self, event, event.data)

    def lay_out_plan(self, planned: tuple[PlanStep, ...]) -> None:
        # A replan keeps what finished steps achieved and lays out the rest afresh.
        steps: dict[str, StepState] = {}
        made: set[str] = set()
        for step in planned:
            known = self.steps.get(step.id)
            if known is not None and known.status == "succeeded" and known.tool:
                steps[step.id] = known
                continue
            if known is not None and known.status == "succeeded":
                # A step a fork carried over from its origin is known by id alone until now.
                steps[step.id] = _copy_with(
                    known,
                    description=step.description,
                    tool=step.tool,
                    arguments=step.arguments,
                    depends_on=step.depends_on,
                    risk=step.risk,
                    requires_approval=step.requires_approval,
                    estimated_duration_s=step.estimated_duration_s,
                    hosts=step.hosts,
                    taint=step.taint,
                )
            else:
                steps[step.id] = StepState(
                    id=step.id,
                    description=step.description,
                    tool=step.tool,
                    arguments=step.arguments,
                    depends_on=step.depends_on,
                    risk=step.risk,
                    requires_approval=step.requires_approval,
                    estimated_duration_s=step.estimated_duration_s,
                    on_denied=step.on_denied,
                    hosts=step.hosts,
                    taint=step.taint,
                )
            made.add(step.id)
        for step_id, known in self.steps.items():
            steps.setdefault(step_id, known)
        dependants: dict[str, list[str]] = {step_id: [] for step_id in steps}
        for laid_out in steps.values():
            for dependency in laid_out.depends_on:
                dependants.setdefault(dependency, []).append(laid_out.id)
        self.steps = Table(steps)
        self.fresh_steps |= made
        for step_id, laid_out in steps.items():
            if laid_out.dependants != (wanted := tuple(dependants[step_id])):
                self.update_step(step_id, dependants=wanted)

    def compensates(self, call_id: str) -> bool:
        return any(call_id in rollback.compensations for rollback in self.rollbacks.values())

    def update_rollback(self, rollback_id: str, **changes: Any) -> None:
        rollback = self.rollbacks.get(rollback_id)
        if rollback is not None:
            self.set_rollback(_copy_with(rollback, **changes))

    def compensation(
        self,
        rollback_id: str,
        compensation_id: str,
        status: Literal["scheduled", "completed", "failed"],
    ) -> None:
        rollback = self.rollbacks.get(rollback_id)
        if rollback is not None:
            compensations = {**rollback.compensations, compensation_id: status}
            self.update_rollback(rollback_id, status="running", compensations=compensations)

    def keep_checkpoints_up_to(self, checkpoint_id: str) -> None:
        for index, checkpoint in enumerate(self.checkpoints):
            if checkpoint.checkpoint_id == checkpoint_id:
                self.checkpoints = self.checkpoints[: index + 1]
                return


# --- reducers: one per event type, beside the state it changes ---------------------------

P = TypeVar("P", bound=Payload)
Reducer = Callable[[SessionFold, Event, Any], None]
"""Changes a fold in progress by one event (its payload given apart, already typed)."""

REDUCERS: dict[type[Payload], Reducer] = {}
"""The reducer of each payload class, looked up by the payload's exact class: the fold is
total when every class of the catalogue (`PAYLOAD_CLASSES`) has one (a test checks it)."""


def _reduces(
    *payloads: type[P],
) -> Callable[[Callable[[SessionFold, Event, P], None]], Callable[[SessionFold, Event, P], None]]:
    """Register the decorated function as the reducer of `payloads`."""

    def register(
        reducer: Callable[[SessionFold, Event, P], None],
    ) -> Callable[[SessionFold, Event, P], None]:
        for payload in payloads:
            assert payload not in REDUCERS, f"{payload.TYPE} has two reducers"
            REDUCERS[payload] = reducer
        return reducer

    return register


@_reduces(
    *SESSIONLESS_CHANNELS,  # Never in a session's log: each is on a stream of its own.
    SandboxExecutionRequested,  # The call is recorded as authorised; the sandbox takes it on.
    SandboxLimitApproached,  # A warning for people and alerts; the call runs on unchanged.
    ContextCompacted,  # Facts for people and replays.
    LoopDetected,
    ApprovalDecisionRefused,  # Answers to the person who decided; the request is unchanged.
    ApprovalVoteCounted,
)
def _unchanged(fold: SessionFold, event: Event, data: Payload) -> None:
    """Events that change nothing a session's state holds, besides its count and time."""


# --- the session --------------------------------------------------------------------------


@_reduces(SessionStarted)
def _started(fold: SessionFold, event: Event, data: SessionStarted) -> None:
    v = fold.v
    if v["status"] == "pending":
        v["status"] = "planning"
    v["goal"] = data.goal
    v["mode"] = data.mode
    v["requested_by"] = data.requested_by
    v["labels"] = dict(data.labels)
    v["fork_of"] = data.fork_of
    if data.fork_of is not None:
        for step_id in data.fork_of.completed_steps:
            reason = f"completed in {data.fork_of.session_id} before the fork"
            fold.update_step(step_id, status="succeeded", reason=reason)
    if data.playbook is not None:
        v["on_denied"] = data.playbook.on_denied
    v["started_at"] = v["started_at"] or event.time


@_reduces(SessionPauseRequested)
def _pause_requested(fold: SessionFold, event: Event, data: SessionPauseRequested) -> None:
    fold.v["pause_requested"] = True


@_reduces(SessionPaused)
def _paused(fold: SessionFold, event: Event, data: SessionPaused) -> None:
    fold.set_status("paused")


@_reduces(SessionResumeRequested)
def _resume_requested(fold: SessionFold, event: Event, data: SessionResumeRequested) -> None:
    fold.v["pause_requested"] = False


@_reduces(SessionResumed)
def _resumed(fold: SessionFold, event: Event, data: SessionResumed) -> None:
    fold.v["pause_requested"] = False
    fold.set_status("waiting" if _any_pending(fold) else "executing")


@_reduces(SessionCancelRequested)
def _cancel_requested(fold: SessionFold, event: Event, data: SessionCancelRequested) -> None:
    fold.v["cancel_requested"] = True


@_reduces(SessionCancelled)
def _cancelled(fold: SessionFold, event: Event, data: SessionCancelled) -> None:
    if not fold.terminal:
        fold.v["outcome"] = data.reason
    fold.end("cancelled", event)


@_reduces(SessionCompleted)
def _completed(fold: SessionFold, event: Event, data: SessionCompleted) -> None:
    if not fold.terminal:
        fold.v["outcome"] = data.summary
        fold.v["partial"] = data.partial
        fold.v["criteria"] = data.criteria
    fold.end("completed", event)


@_reduces(SessionFailed)
def _failed(fold: SessionFold, event: Event, data: SessionFailed) -> None:
    if not fold.terminal:
        fold.v["outcome"] = data.reason
    fold.end("failed", event)


@_reduces(ModelExchangeRecorded)
def _model_exchange(fold: SessionFold, event: Event, data: ModelExchangeRecorded) -> None:
    v = fold.v
    v["model_calls"] += 1
    v["tokens_used"] += data.reply.usage.input_tokens + data.reply.usage.output_tokens
    v["cost_usd"] += data.cost_usd or 0.0
    v["model_usage"] = _tallied(v["model_usage"], data)


@_reduces(ThoughtRecorded)
def _thought(fold: SessionFold, event: Event, data: ThoughtRecorded) -> None:
    fold.thoughts = fold.thoughts.append(
        ThoughtState(
            kind=data.kind,
            text=data.text,
            at=event.time,
            confidence=data.confidence,
            step_id=data.step_id,
            alternatives=data.alternatives,
        ),
    )


# --- the plan -----------------------------------------------------------------------------


@_reduces(PlanProposed)
def _plan_proposed(fold: SessionFold, event: Event, data: PlanProposed) -> None:
    v = fold.v
    v["plan_revision"] = data.revision
    v["plan_confidence"] = data.confidence
    v["plan_reasoning"] = data.reasoning
    v["plan_rejection"] = None
    v["plan_approval"] = None
    v["plan_estimated_duration_s"] = data.estimated_duration_s
    v["plan_permissions"] = data.permissions
    if data.completion_criteria:
        v["completion_criteria"] = data.completion_criteria
        v["criteria_required"] = data.criteria_required
    fold.lay_out_plan(data.steps)
    fold.set_status("planning")


@_reduces(PlanApproved)
def _plan_approved(fold: SessionFold, event: Event, data: PlanApproved) -> None:
    fold.v["plan_approved_revision"] = data.revision
    fold.v["plan_approval"] = data
    fold.set_status("executing")


@_reduces(PlanRejected)
def _plan_rejected(fold: SessionFold, event: Event, data: PlanRejected) -> None:
    fold.v["plan_rejection"] = data.reason


# --- steps and their calls ----------------------------------------------------------------


@_reduces(StepScheduled, StepAuthorized)
def _step_scheduled(fold: SessionFold, event: Event, data: StepScheduled) -> None:
    fold.calls = fold.calls.set(data.call_id, data.step_id)
    if data.compensation_id is not None:
        return  # A rollback's undo call: recorded in the rollback, not a step of the plan.
    previous = fold.steps.get(data.step_id)
    fold.update_step(
        data.step_id,
        tool=data.tool,
        arguments=data.arguments,
        risk=data.risk if data.risk is not None else previous and previous.risk,
        status="scheduled",
        attempts=data.attempt,
        retries=0,
        call_id=data.call_id,
        output=None,
        cached_from=None,
        error=None,
        limit_hit=None,
        reason=None,
        scheduled_at=event.time,
        finished_at=None,
        duration_ms=None,
        retry_at=None,
    )
    if fold.v["status"] == "planning":
        fold.set_status("executing")
    approved = fold.v["plan_approval"]
    if data.authorized_by_plan is not None and approved is not None:
        authorized = data.authorized_by(approved)
        if authorized is not None:
            _authorized(fold, event, authorized)


@_reduces(ToolCallAuthorized)
def _authorized(fold: SessionFold, event: Event, data: ToolCallAuthorized) -> None:
    """A call may run: authorised when scheduled, by its approved plan, or on its own."""
    fold.update_call(
        data.call_id, data.step_id, status="authorized", arguments=data.arguments, risk=data.risk
    )
    _similar_used(fold, data)


@_reduces(ToolCallStarted)
def _call_started(fold: SessionFold, event: Event, data: ToolCallStarted) -> None:
    fold.update_call(data.call_id, data.step_id, status="running")


@_reduces(ToolCallAttemptFailed)
def _attempt_failed(fold: SessionFold, event: Event, data: ToolCallAttemptFailed) -> None:
    # The call goes on; its final outcome is recorded when it comes.
    fold.update_call(data.call_id, data.step_id, retries=data.attempt)


@_reduces(ToolCallCompleted)
def _call_completed(fold: SessionFold, event: Event, data: ToolCallCompleted) -> None:
    fold.update_call(
        data.call_id,
        data.step_id,
        status="succeeded",
        output=data.output,
        cached_from=data.cached_from,
        error=None,
        redacted_by=dict(data.redacted_by),
        finished_at=event.time,
        duration_ms=data.duration_ms,
    )


@_reduces(ToolCallFailed)
def _call_failed(fold: SessionFold, event: Event, data: ToolCallFailed) -> None:
    fold.update_call(
        data.call_id,
        data.step_id,
        status="failed",
        error=data.error,
        redacted_by=dict(data.redacted_by),
        finished_at=event.time,
        duration_ms=data.duration_ms,
    )


@_reduces(ToolCallDenied)
def _call_denied(fold: SessionFold, event: Event, data: ToolCallDenied) -> None:
    fold.update_call(
        data.call_id, data.step_id, status="denied", reason=data.reason, finished_at=event.time
    )


@_reduces(SandboxLimitExceeded)
def _limit_exceeded(fold: SessionFold, event: Event, data: SandboxLimitExceeded) -> None:
    fold.update_call(data.call_id, data.step_id, limit_hit=data.hit)


@_reduces(StepSkipped)
def _step_skipped(fold: SessionFold, event: Event, data: StepSkipped) -> None:
    fold.update_step(data.step_id, status="skipped", reason=data.reason, finished_at=event.time)


@_reduces(StepRetryDeferred)
def _retry_deferred(fold: SessionFold, event: Event, data: StepRetryDeferred) -> None:
    step = fold.steps.get(data.step_id)
    if step is not None and step.call_id == data.call_id:
        fold.update_step(data.step_id, retry_at=data.retry_at, reason=data.reason)


# --- approvals: every fact about a request enters here, through `set_approval` -----------


def _any_pending(fold: SessionFold) -> bool:
    return any(a.status == "pending" for a in fold.approvals.values())


@_reduces(ApprovalRequested, PermissionRequested)
def _approval_requested(fold: SessionFold, event: Event, data: ApprovalRequested) -> None:
    fold.set_approval(
        ApprovalState(
            request_id=data.request_id,
            scope=data.scope,
            risk=data.risk,
            reason=data.reason,
            expires_at=data.expires_at,
            requested_at=event.time,
            step_id=data.step_id,
            call_id=data.call_id,
            tool=data.tool,
            arguments=data.arguments,
            taint=data.taint,
            rule=data.rule,
            definition_digest=data.definition_digest,
            approver_roles=data.approver_roles,
            quorum=data.quorum,
            permissions=data.permissions if isinstance(data, PermissionRequested) else (),
        )
    )
    if data.step_id is not None and not fold.compensates(data.call_id or ""):
        fold.update_step(data.step_id, approval_request_id=data.request_id)
    if fold.v["status"] != "paused":
        # A paused session stays paused: a grant runs nothing until it resumes.
        fold.set_status("waiting")


@_reduces(ApprovalDecisionSubmitted)
def _vote(fold: SessionFold, event: Event, data: ApprovalDecisionSubmitted) -> None:
    request = fold.approvals.get(data.request_id)
    if request is not None:
        fold.set_approval(_copy_with(request, votes=(*request.votes, data)))


@_reduces(ApprovalGranted)
def _granted(fold: SessionFold, event: Event, data: ApprovalGranted) -> None:
    standing = (
        {
            "similar_limit": data.similar_limit,
            "similar_until": data.similar_until,
            "similar_where": data.similar_where,
            "grant_scope": data.grant_scope,
            "grant_until": data.grant_until,
        }
        if data.similar_limit is not None or data.grant_scope is not None
        else {}
    )
    _decided(
        fold,
        event,
        data.request_id,
        "granted",
        decided_by=data.decided_by,
        comment=data.comment,
        modified_arguments=data.modified_arguments,
        **standing,
    )


@_reduces(ApprovalDenied)
def _denied(fold: SessionFold, event: Event, data: ApprovalDenied) -> None:
    _decided(
        fold, event, data.request_id, "denied", decided_by=(data.decided_by,), comment=data.comment
    )


@_reduces(ApprovalExpired)
def _expired(fold: SessionFold, event: Event, data: ApprovalExpired) -> None:
    _decided(fold, event, data.request_id, "expired")


def _decided(
    fold: SessionFold,
    event: Event,
    request_id: str,
    status: Literal["granted", "denied", "expired", "withdrawn"],
    **outcome: Any,
) -> None:
    """The outcome of a pending request (granted, denied, expired, or withdrawn when the
    session ended), in one write; a request no longer pending keeps its first outcome."""
    request = fold.approvals.get(request_id)
    if request is None or request.status != "pending":
        return
    fold.set_approval(
        _copy_with(
            request,
            status=status,
            decided_by=outcome.pop("decided_by", ()),
            comment=outcome.pop("comment", ""),
            modified_arguments=outcome.pop("modified_arguments", None),
            decided_at=event.time,
            **outcome,
        )
    )
    if fold.v["status"] == "waiting" and not _any_pending(fold):
        fold.v["status"] = "paused" if fold.v["pause_requested"] else "executing"


def _similar_used(fold: SessionFold, authorized: ToolCallAuthorized) -> None:
    # A later call authorised under a standing "approve similar" grant uses it up.
    request_id = authorized.approval_request_id
    request = fold.approvals.get(request_id) if request_id is not None else None
    if (
        request is not None
        and request.similar_limit is not None
        and request.call_id != authorized.call_id
    ):
        fold.set_approval(_copy_with(request, similar_used=request.similar_used + 1))


# --- the workspace and checkpoints --------------------------------------------------------


@_reduces(CheckpointCreated)
def _checkpoint(fold: SessionFold, event: Event, data: CheckpointCreated) -> None:
    fold.checkpoints = fold.checkpoints.append(
        CheckpointState(
            checkpoint_id=data.checkpoint_id,
            step_id=data.step_id,
            at_seq=data.at_seq,
            created_at=event.time,
            snapshot_id=data.snapshot_id,
            reversible=data.reversible,
            compensation=data.compensation,
            call_id=data.call_id,
            tool=data.tool,
            effect=data.effect,
            inverse=data.inverse,
            changes=data.changes,
        ),
    )


@_reduces(WorkspaceSnapshotted)
def _snapshotted(fold: SessionFold, event: Event, data: WorkspaceSnapshotted) -> None:
    v = fold.v
    v["latest_snapshot_id"] = data.snapshot_id
    v["latest_snapshot_call_id"] = data.call_id
    v["latest_snapshot_changes"] = data.changes
    v["initial_snapshot_id"] = v["initial_snapshot_id"] or data.snapshot_id
    if data.irreversible_reason is not None:
        v["unrestorable_snapshots"] = v["unrestorable_snapshots"].set(
            data.snapshot_id, data.irreversible_reason
        )


@_reduces(WorkspaceSnapshotsPruned)
def _snapshots_pruned(fold: SessionFold, event: Event, data: WorkspaceSnapshotsPruned) -> None:
    fold.v["unrestorable_snapshots"] = fold.v["unrestorable_snapshots"].update(
        dict.fromkeys(data.snapshot_ids, f"pruned: {data.reason}")
    )


@_reduces(WorkspaceRestored)
def _restored(fold: SessionFold, event: Event, data: WorkspaceRestored) -> None:
    fold.v["latest_snapshot_id"] = data.snapshot_id
    fold.v["latest_snapshot_call_id"] = None
    fold.v["latest_snapshot_changes"] = None


# --- rollbacks ----------------------------------------------------------------------------


@_reduces(RollbackRequested)
def _rollback_requested(fold: SessionFold, event: Event, data: RollbackRequested) -> None:
    fold.set_rollback(
        RollbackState(
            rollback_id=data.rollback_id,
            checkpoint_id=data.checkpoint_id,
            requested_by=data.requested_by,
            accept_partial=data.accept_partial,
            reason=data.reason,
        )
    )


@_reduces(RollbackRefused)
def _rollback_refused(fold: SessionFold, event: Event, data: RollbackRefused) -> None:
    fold.update_rollback(
        data.rollback_id, status="refused", reason=data.reason, blocking_steps=data.blocking_steps
    )


@_reduces(CompensationScheduled)
def _compensation_scheduled(fold: SessionFold, event: Event, data: CompensationScheduled) -> None:
    fold.compensation(data.rollback_id, data.compensation_id, "scheduled")


@_reduces(CompensationCompleted)
def _compensation_completed(fold: SessionFold, event: Event, data: CompensationCompleted) -> None:
    fold.compensation(data.rollback_id, data.compensation_id, "completed")
    for step_id in dict.fromkeys((data.step_id, *data.steps)):
        if step_id in fold.steps:
            fold.update_step(step_id, status="undone")


@_reduces(CompensationFailed)
def _compensation_failed(fold: SessionFold, event: Event, data: CompensationFailed) -> None:
    fold.compensation(data.rollback_id, data.compensation_id, "failed")


@_reduces(RollbackCompleted)
def _rollback_completed(fold: SessionFold, event: Event, data: RollbackCompleted) -> None:
    fold.update_rollback(
        data.rollback_id,
        status="completed",
        undone_steps=data.undone_steps,
        not_undone_steps=data.not_undone_steps,
    )
    for step_id in data.undone_steps:
        if step_id in fold.steps:
            fold.update_step(step_id, status="undone")
    fold.keep_checkpoints_up_to(data.checkpoint_id)
    # A rolled-back session waits for a person to resume or replan it.
    fold.v["status"] = "paused"
    fold.v["ended_at"] = None
    fold.v["outcome"] = ""


@_reduces(RollbackFailed)
def _rollback_failed(fold: SessionFold, event: Event, data: RollbackFailed) -> None:
    fold.update_rollback(
        data.rollback_id,
        status="failed",
        reason=data.reason,
        undone_steps=data.undone_steps,
        not_undone_steps=data.not_undone_steps,
    )
