"""The session routes: every read is a fold of the log, every command one appended event."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import AwareDatetime, BaseModel, Field, model_validator

from helmline.api._auth import Approver, Operator, Principal, Viewer
from helmline.api._problems import (
    PROBLEM_RESPONSES,
    FieldProblem,
    ProblemDetails,
    conflict,
    forbidden,
    invalid,
    not_found,
)
from helmline.api._reads import SessionFilter, SessionLister, SessionSummary, load_session
from helmline.contracts import (
    ApprovalDecisionSubmitted,
    ApprovalState,
    ArgumentCondition,
    Arguments,
    CheckpointState,
    Event,
    ForkOrigin,
    GrantScope,
    Payload,
    Playbook,
    RollbackRequested,
    SessionCancelRequested,
    SessionId,
    SessionPauseRequested,
    SessionResumeRequested,
    SessionStarted,
    SessionState,
    SessionStatus,
    ToolSpec,
    cut,
    fold,
    new_event,
    quoted,
)
from helmline.runtime import (
    ArgumentChecker,
    EventStore,
    FoldedStates,
    latest_tool_registry,
    playbook_problems,
    tools_of,
    unknown_arguments,
)

SOURCE = "helmline/api"
_ARGUMENTS = ArgumentChecker()
"""Each tool's schema compiled once (again when the registry changes it), not per decision."""

Responses = dict[int | str, dict[str, Any]]

NOT_FOUND: Responses = {
    404: {"model": ProblemDetails, "description": "No such session in the principal's tenant"}
}
CONFLICTS: Responses = {
    **NOT_FOUND,
    409: {"model": ProblemDetails, "description": "The session is not in a state that allows it"},
}

router = APIRouter(responses=PROBLEM_RESPONSES)

SessionPath = Annotated[SessionId, "the session id"]


class NewSession(BaseModel):
    """A session to start: a goal for the planner, or a declared playbook."""

    goal: str | None = Field(default=None, min_length=1, max_length=10_000)
    """What to achieve; with a playbook, overrides the playbook's goal."""
    playbook: Playbook | None = None
    """Declared steps to run instead of planning."""
    labels: dict[str, str] = {}
    """Free labels for finding the session later."""

    @model_validator(mode="after")
    def _goal_or_playbook(self) -> NewSession:
        if self.goal is None and self.playbook is None:
            raise ValueError("give a goal, a playbook, or both")
        return self


class Accepted(BaseModel):
    """The command's event is in the log; services act on it from there."""

    session_id: str
    seq: int
    """Stream sequence of the appended event (`GET /sessions/{id}?at_seq=` from there)."""
    event_id: str
    """The appended event's id: what the services append in answer to it carry it as their
    `causationid` (the approval service's answer to a decision, for one)."""

    @classmethod
    def of(cls, event: Event, seq: int) -> Accepted:
        return cls(session_id=event.session_id, seq=seq, event_id=str(event.id))


class Control(BaseModel):
    """A pause or cancel: the body may be left out (no reason given)."""

    reason: str = Field(default="", max_length=2000)
    """Why, in the person's words."""


NO_REASON = Control()


class Decision(BaseModel):
    """A decision on a pending approval request."""

    decision: Literal["grant", "deny"]
    comment: str = Field(default="", max_length=2000)
    modified_arguments: Arguments | None = None
    """Arguments to run the call with instead of the requested ones (grant only)."""
    similar_limit: int | None = Field(default=None, ge=1, le=1000)
    """Let the grant also stand for up to this many later calls of the same tool and rule."""
    similar_until: AwareDatetime | None = None
    """With `similar_limit`: when that standing grant ends (an hour after the grant when
    not given)."""
    similar_where: dict[str, ArgumentCondition] | None = None
    """With `similar_limit`: conditions on the later calls' arguments, by name, that each
    must meet to run under the grant (as a policy rule's `arguments`)."""
    grant_scope: GrantScope | None = None
    """A permission request: grant it for the step that asked or for the session (every
    later call needing it); the step when not given."""
    grant_until: AwareDatetime | None = None
    """A permission request: when the grant ends (the policy's `grant_expires_in` from now
    when not given; at most its `grant_at_most`)."""

    @model_validator(mode="after")
    def _modifications_only_with_grant(self) -> Decision:
        if self.decision == "deny" and (
            self.modified_arguments is not None
            or self.similar_limit is not None
            or self.grant_scope is not None
            or self.grant_until is not None
        ):
            raise ValueError(
                "modified_arguments, similar_limit, grant_scope and grant_until only go with "
                "a grant"
            )
        if self.grant_until is not None and self.grant_until <= datetime.now(UTC):
            raise ValueError("grant_until is not in the future")
        if self.similar_limit is None and (
            self.similar_until is not None or self.similar_where is not None
        ):
            raise ValueError("similar_until and similar_where go with similar_limit")
        if self.similar_until is not None and self.similar_until <= datetime.now(UTC):
            raise ValueError("similar_until is not in the future")
        return self


class Rollback(BaseModel):
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The checkpoint to return to: every step after it is undone."""
    accept_partial: bool = False
    """Undo what can be undone even if an irreversible step is in the way."""
    reason: str = Field(default="", max_length=2000)


class RollbackAccepted(Accepted):
    rollback_id: str


class Fork(BaseModel):
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The origin's checkpoint the fork starts from: its workspace snapshot, and the steps
    completed by then, which the fork does not run again."""


def _store(request: Request) -> EventStore:
    store: EventStore = request.app.state.store
    return store


def _states(request: Request) -> FoldedStates:
    states: FoldedStates = request.app.state.states
    return states


async def _tools(request: Request) -> Mapping[str, ToolSpec]:
    """The tools plans may call now: the tool gateways' latest published registry (built-in
    and MCP tools), else the built-in ones."""
    return tools_of(await latest_tool_registry(request.app.state.js))


async def _accepted(
    request: Request, principal: Principal, session_id: str, payload: Payload
) -> Accepted:
    """Append the command's event to the session."""
    event: Event = new_event(payload, tenant=principal.tenant, session_id=session_id, source=SOURCE)
    return Accepted.of(event, (await _store(request).append(event)).seq)


async def _steer(
    request: Request, principal: Principal, session_id: str, control: Payload
) -> Accepted:
    """Append a pause, resume or cancel request to a session that has not ended."""
    state = (await load_session(_states(request), principal.tenant, session_id)).state
    if state.is_terminal:
        raise conflict(f"session {session_id} has already ended: {state.status}")
    return await _accepted(request, principal, session_id, control)


@router.post("/sessions", status_code=201, tags=["sessions"], responses=NOT_FOUND)
async def create_session(
    body: NewSession, principal: Operator, request: Request, response: Response
) -> Accepted:
    """Start a session: `session.started` with the goal (mode plan) or the playbook.

    A playbook is checked against the tools plans may call now, as `helmline run` checks
    it: a step naming an unknown tool, or arguments its tool's schema refuses, start
    nothing (422, each problem named).
    """
    if body.playbook is not None:
        problems = playbook_problems(body.playbook, await _tools(request))
        if problems:
            raise invalid(
                [
                    FieldProblem(
                        field=".".join(str(part) for part in ("body", "playbook", *p.location)),
                        message=p.message,
                    )
                    for p in problems
                ]
            )
    session_id = uuid.uuid4().hex
    goal = body.goal or (body.playbook.goal if body.playbook else "")
    payload = SessionStarted(
        goal=goal,
        mode="playbook" if body.playbook else "plan",
        playbook=body.playbook,
        requested_by=principal.actor(),
        labels=body.labels,
    )
    event = new_event(payload, tenant=principal.tenant, session_id=session_id, source=SOURCE)
    # A new id has no events; expecting none only guards against an id collision.
    appended = await _store(request).append(event, expected_last_seq=0)
    response.headers["Location"] = f"/sessions/{session_id}"
    return Accepted.of(event, appended.seq)


@router.get("/sessions", tags=["sessions"])
async def list_sessions(
    principal: Viewer,
    request: Request,
    status: Annotated[list[SessionStatus], Query()] = [],  # noqa: B006 - FastAPI copies it
    waiting: Annotated[
        bool | None, Query(description="Only sessions with (or without) a pending approval")
    ] = None,
    ended_after: Annotated[
        AwareDatetime | None,
        Query(description="Only sessions that ended at or after this time (with its offset)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> list[SessionSummary]:
    """The tenant's sessions, newest first, with what each waits for."""
    lister: SessionLister = request.app.state.lister
    query = SessionFilter(
        status=status, waiting=waiting, ended_after=ended_after, limit=limit, offset=offset
    )
    return await lister.sessions(principal.tenant, query)


@router.get("/sessions/{session_id}", tags=["sessions"], responses=NOT_FOUND)
async def get_session(
    session_id: SessionPath,
    principal: Viewer,
    request: Request,
    response: Response,
    at_seq: Annotated[
        int | None, Query(ge=1, description="The state as it was after this stream sequence")
    ] = None,
) -> SessionState:
    """The session folded from its log: plan, steps, approvals, checkpoints, thoughts."""
    snapshot = await load_session(_states(request), principal.tenant, session_id, at_seq=at_seq)
    response.headers["X-Last-Seq"] = str(snapshot.last_seq)
    return snapshot.state


@router.get("/sessions/{session_id}/checkpoints", tags=["sessions"], responses=NOT_FOUND)
async def list_checkpoints(
    session_id: SessionPath, principal: Viewer, request: Request
) -> list[CheckpointState]:
    """The points the session can be rolled back to, oldest first."""
    state = (await load_session(_states(request), principal.tenant, session_id)).state
    return list(state.checkpoints)


@router.post(
    "/sessions/{session_id}/approvals/{request_id}",
    status_code=202,
    tags=["approvals"],
    responses=CONFLICTS,
)
async def decide(
    session_id: SessionPath,
    request_id: Annotated[str, "the approval request"],
    body: Decision,
    principal: Approver,
    request: Request,
) -> Accepted:
    """Grant (optionally with modified arguments) or deny a pending approval request.

    The approval service judges the decision: modified arguments must fit the tool's schema
    and the policy in force.
    """
    state = (await load_session(_states(request), principal.tenant, session_id)).state
    approval = state.approvals.get(request_id)
    if approval is None:
        raise not_found(f"session {session_id} has no approval request {cut(request_id)}")
    if approval.status != "pending":
        raise conflict(f"approval request {request_id} is already {approval.status}")
    actor = principal.actor()
    if approval.approver_roles and set(actor.roles).isdisjoint(approval.approver_roles):
        raise forbidden(
            f"approval request {request_id} may be decided by "
            f"{', '.join(approval.approver_roles)} only"
        )
    kind_problems = _kind_problems(body, approval)
    if kind_problems:
        raise invalid(kind_problems)
    if approval.tool is not None and (body.modified_arguments is not None or body.similar_where):
        # The approval service judges them too (and the policy); what the tool's schema
        # refuses is named at once.
        tool = (await _tools(request)).get(approval.tool)
        problems = _argument_problems(body, tool) if tool else []
        if problems:
            raise invalid(problems)
    payload = ApprovalDecisionSubmitted(
        request_id=request_id,
        decision=body.decision,
        decided_by=actor,
        comment=body.comment,
        modified_arguments=body.modified_arguments,
        similar_limit=body.similar_limit,
        similar_until=body.similar_until,
        similar_where=body.similar_where,
        grant_scope=body.grant_scope,
        grant_until=body.grant_until,
    )
    return await _accepted(request, principal, session_id, payload)


def _kind_problems(decision: Decision, approval: ApprovalState) -> list[FieldProblem]:
    """What does not fit the kind of request decided: a permission request is granted as
    asked, for the step or the session; a call or a plan is approved without a grant scope."""
    given: tuple[tuple[str, object], ...]
    if approval.permissions:
        given = (
            ("modified_arguments", decision.modified_arguments),
            ("similar_limit", decision.similar_limit),
            ("similar_where", decision.similar_where),
        )
        why = "a permission request is granted as asked: use grant_scope and grant_until"
    else:
        given = (("grant_scope", decision.grant_scope), ("grant_until", decision.grant_until))
        why = f"only for permission requests; {approval.request_id} asks to approve a " + (
            "call" if approval.tool else "plan"
        )
    return [
        FieldProblem(field=f"body.{name}", message=why)
        for name, value in given
        if value is not None
    ]


def _argument_problems(decision: Decision, tool: ToolSpec) -> list[FieldProblem]:
    """What the tool's schema refuses in a grant: modified arguments that do not fit it, and
    arguments a standing grant is limited to that the tool does not have."""
    problems = []
    if decision.modified_arguments is not None:
        wrong = _ARGUMENTS.problem(tool, decision.modified_arguments)
        if wrong is not None:
            path = filter(None, (wrong.field or "").split("/"))
            field = ".".join(("body", "modified_arguments", *path))
            problems.append(FieldProblem(field=field, message=wrong.message))
    for name in unknown_arguments(tool, decision.similar_where or {}):
        message = f"{tool.name} has no argument {quoted(name)} to limit to"
        problems.append(FieldProblem(field=f"body.similar_where.{cut(name)}", message=message))
    return problems


@router.post("/sessions/{session_id}/pause", status_code=202, tags=["control"], responses=CONFLICTS)
async def pause(
    session_id: SessionPath, principal: Operator, request: Request, body: Control = NO_REASON
) -> Accepted:
    """Ask that no new step start; a running step finishes."""
    return await _steer(
        request,
        principal,
        session_id,
        SessionPauseRequested(requested_by=principal.actor(), reason=body.reason),
    )


@router.post(
    "/sessions/{session_id}/resume", status_code=202, tags=["control"], responses=CONFLICTS
)
async def resume(session_id: SessionPath, principal: Operator, request: Request) -> Accepted:
    """Ask a paused session to continue."""
    return await _steer(
        request, principal, session_id, SessionResumeRequested(requested_by=principal.actor())
    )


@router.post(
    "/sessions/{session_id}/cancel", status_code=202, tags=["control"], responses=CONFLICTS
)
async def cancel(
    session_id: SessionPath, principal: Operator, request: Request, body: Control = NO_REASON
) -> Accepted:
    """Ask that the session stop for good; a running command is killed."""
    return await _steer(
        request,
        principal,
        session_id,
        SessionCancelRequested(requested_by=principal.actor(), reason=body.reason),
    )


@router.post(
    "/sessions/{session_id}/rollback", status_code=202, tags=["control"], responses=NOT_FOUND
)
async def rollback(
    session_id: SessionPath, body: Rollback, principal: Operator, request: Request
) -> RollbackAccepted:
    """Ask that the session be rolled back to a checkpoint (`rollback.requested`).

    The state service runs the compensations in reverse order, or refuses when an
    irreversible step is in the way and a partial rollback was not accepted.
    """
    state = (await load_session(_states(request), principal.tenant, session_id)).state
    if not any(c.checkpoint_id == body.checkpoint_id for c in state.checkpoints):
        raise not_found(f"session {session_id} has no checkpoint {body.checkpoint_id}")
    rollback_id = uuid.uuid4().hex
    payload = RollbackRequested(
        rollback_id=rollback_id,
        checkpoint_id=body.checkpoint_id,
        requested_by=principal.actor(),
        accept_partial=body.accept_partial,
        reason=body.reason,
    )
    accepted = await _accepted(request, principal, session_id, payload)
    return RollbackAccepted(**accepted.model_dump(), rollback_id=rollback_id)


@router.post("/sessions/{session_id}/fork", status_code=201, tags=["sessions"], responses=CONFLICTS)
async def fork(
    session_id: SessionPath, body: Fork, principal: Operator, request: Request, response: Response
) -> Accepted:
    """Start a new session from one of this one's checkpoints (`session.started` with
    `fork_of`): same goal and playbook, the workspace as it was there."""
    store = _store(request)
    current = (await load_session(_states(request), principal.tenant, session_id)).state
    checkpoint = next(
        (c for c in current.checkpoints if c.checkpoint_id == body.checkpoint_id), None
    )
    if checkpoint is None:
        raise not_found(f"session {session_id} has no checkpoint {body.checkpoint_id}")
    refusal = current.fork_refusal(checkpoint)
    if refusal is not None:
        raise conflict(refusal)
    history = await store.read_all(principal.tenant, session_id, up_to_seq=checkpoint.at_seq)
    then = fold(stored.event for stored in history)
    origin = next(s.event.data for s in history if isinstance(s.event.data, SessionStarted))
    payload = origin.model_copy(
        update={
            "requested_by": principal.actor(),
            "fork_of": ForkOrigin(
                session_id=session_id,
                at_seq=checkpoint.at_seq,
                checkpoint_id=checkpoint.checkpoint_id,
                snapshot_id=checkpoint.snapshot_id,
                completed_steps=tuple(
                    step.id for step in then.steps.values() if step.status == "succeeded"
                ),
            ),
        }
    )
    new_id = uuid.uuid4().hex
    event = new_event(payload, tenant=principal.tenant, session_id=new_id, source=SOURCE)
    appended = await store.append(event, expected_last_seq=0)
    response.headers["Location"] = f"/sessions/{new_id}"
    return Accepted.of(event, appended.seq)


@router.get("/tools", tags=["tools"])
async def list_tools(principal: Viewer, request: Request) -> list[ToolSpec]:
    """The tools plans may call now, with their argument schemas and default risk: the tool
    gateway's latest published registry (built-in and MCP tools), else the built-in ones."""
    return list((await _tools(request)).values())


class Me(BaseModel):
    id: str
    tenant: str
    roles: list[str]


@router.get("/me", tags=["auth"])
async def me(principal: Viewer) -> Me:
    """Who the credential belongs to."""
    return Me(id=principal.id, tenant=principal.tenant, roles=sorted(principal.roles))
