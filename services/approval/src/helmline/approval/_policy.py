"""The default policy, and how decisions on approval requests are judged. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalState,
    Payload,
    PlanApproved,
    PlanProposed,
    Risk,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
)

POLICY = Actor(id="default-policy", kind="policy")
APPROVAL_EXPIRY = timedelta(minutes=10)
APPROVER_ROLES = ("approver", "admin")
RISK_ORDER: tuple[Risk, ...] = ("low", "medium", "high", "critical")


@dataclass(frozen=True, slots=True)
class Decision:
    """An event to append, and what makes it unique when it must be stored once."""

    payload: Payload
    identity: str | None = None


def judge_plan(proposed: PlanProposed) -> list[Decision]:
    """The default policy approves plans; risky steps are asked about one by one."""
    approval = PlanApproved(revision=proposed.revision, approved_by=POLICY)
    return [Decision(approval, f"plan.approved/{proposed.revision}")]


def judge_step(scheduled: StepScheduled, now: datetime) -> list[Decision]:
    """Unknown tools are denied; low and medium risk run; high and critical need a person."""
    identity = f"judged/{scheduled.call_id}"
    tool = BUILTIN_TOOLS_BY_NAME.get(scheduled.tool)
    if tool is None:
        denial = ToolCallDenied(
            call_id=scheduled.call_id,
            step_id=scheduled.step_id,
            tool=scheduled.tool,
            reason=f"unknown tool {scheduled.tool!r}: only registered tools may run",
            rule="default: deny unknown tools",
        )
        return [Decision(denial, identity)]
    # A plan may raise a step's risk, never lower it below the tool's own.
    risk = max(tool.risk, scheduled.risk or tool.risk, key=RISK_ORDER.index)
    if risk in ("low", "medium"):
        authorized = ToolCallAuthorized(
            call_id=scheduled.call_id,
            step_id=scheduled.step_id,
            tool=scheduled.tool,
            arguments=scheduled.arguments,
            risk=risk,
            rule="default: allow low and medium risk",
        )
        return [Decision(authorized, identity)]
    request = ApprovalRequested(
        request_id=scheduled.call_id,
        scope="step",
        step_id=scheduled.step_id,
        call_id=scheduled.call_id,
        tool=scheduled.tool,
        arguments=scheduled.arguments,
        risk=risk,
        reason=f"{risk}-risk tool calls need a person's approval",
        rule="default: require approval for high and critical risk",
        approver_roles=APPROVER_ROLES,
        expires_at=now + APPROVAL_EXPIRY,
    )
    return [Decision(request, identity)]


def judge_vote(state: SessionState, vote: ApprovalDecisionSubmitted) -> list[Decision]:
    """A person's decision on a pending request, if they may make it."""
    request = state.approvals.get(vote.request_id)
    if request is None or request.status != "pending":
        return []
    if not set(vote.decided_by.roles) & set(request.approver_roles or APPROVER_ROLES):
        return []
    if vote.decision == "deny":
        reason = f"denied by {vote.decided_by.id}" + (f": {vote.comment}" if vote.comment else "")
        return [
            Decision(
                ApprovalDenied(
                    request_id=request.request_id, decided_by=vote.decided_by, comment=vote.comment
                ),
                f"decided/{request.request_id}",
            ),
            *_deny_call(request, reason),
        ]
    arguments = (
        vote.modified_arguments
        if vote.modified_arguments is not None
        else (request.arguments or {})
    )
    granted = ApprovalGranted(
        request_id=request.request_id,
        decided_by=(vote.decided_by,),
        comment=vote.comment,
        modified_arguments=vote.modified_arguments,
    )
    decisions = [Decision(granted, f"decided/{request.request_id}")]
    if request.call_id is not None and request.step_id is not None and request.tool:
        authorized = ToolCallAuthorized(
            call_id=request.call_id,
            step_id=request.step_id,
            tool=request.tool,
            arguments=arguments,
            risk=request.risk,
            rule=request.rule,
            approval_request_id=request.request_id,
        )
        decisions.append(Decision(authorized, f"outcome/{request.request_id}"))
    return decisions


def judge_expiry(state: SessionState, request_id: str, now: datetime) -> list[Decision]:
    """An unanswered request past its expiry becomes a denial."""
    request = state.approvals.get(request_id)
    if request is None or request.status != "pending" or request.expires_at > now:
        return []
    return [
        Decision(ApprovalExpired(request_id=request_id), f"decided/{request_id}"),
        *_deny_call(request, "nobody decided before the approval request expired"),
    ]


def _deny_call(request: ApprovalState, reason: str) -> list[Decision]:
    if request.call_id is None or request.step_id is None or not request.tool:
        return []
    denial = ToolCallDenied(
        call_id=request.call_id,
        step_id=request.step_id,
        tool=request.tool,
        reason=reason,
        rule=request.rule,
        approval_request_id=request.request_id,
    )
    return [Decision(denial, f"outcome/{request.request_id}")]
