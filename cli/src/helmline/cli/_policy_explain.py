"""Why a step was allowed, denied or sent to a person: the log's record beside the policy's
reasoning. Pure: the log is read and the policy loaded by the command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from helmline.approval import Policy, RuleCheck, Verdict, as_the_plan_asks, uses_by_rule
from helmline.cli._errors import CliError
from helmline.contracts import (
    ApprovalRequested,
    Event,
    PermissionRequested,
    SessionState,
    ToolCallAuthorized,
    ToolCallDenied,
    authorizations,
)

Recorded = ApprovalRequested | ToolCallAuthorized | ToolCallDenied


@dataclass(frozen=True)
class StepExplanation:
    """What the log says about a step's call, and how the given policy judges that call."""

    step_id: str
    call: str
    requester: str
    recorded: Recorded | None
    """The policy's decision as recorded: the first decision event about the call."""
    judged_at: datetime
    """The moment the call is judged as of: when the decision was recorded, else now."""
    outcome: str | None
    """What became of an approval request, when one was made."""
    policy: Policy
    checks: tuple[RuleCheck, ...]
    verdict: Verdict

    @property
    def same_policy(self) -> bool:
        """Whether the policy explained is the one the recorded decision was made under."""
        return self.recorded is not None and self.recorded.policy_hash == self.policy.hash


def explain_step(
    state: SessionState, events: Sequence[Event], step_id: str, policy: Policy, now: datetime
) -> StepExplanation:
    """Explain the latest call of a step, or `CliError` when there is nothing to explain.

    The call is judged as of the moment its decision was recorded (or `now`, before any),
    so that a rule's time window is read as it was then, and its `at_most` counts the calls
    that ran before it."""
    step = state.steps.get(step_id)
    if step is None:
        known = ", ".join(state.steps) or "none"
        raise CliError(f"session {state.session_id} has no step {step_id!r} (steps: {known})")
    if step.call_id is None:
        raise CliError(f"step {step_id} has not been scheduled yet: no decision to explain")
    first = _first_decision(events, step.call_id)
    recorded, judged_at = (first.data, first.time) if first is not None else (None, now)
    earlier = uses_by_rule(events[: first.position] if first is not None else events)
    requester = state.requested_by
    facts = policy.facts(
        tenant=state.tenant,
        tool=step.tool,
        arguments=step.arguments,
        declared_risk=step.risk,
        requester=requester,
        at=judged_at,
        rule_uses=earlier,
        hosts=step.hosts,
        granted=state.granted_permissions(step_id, judged_at),
        taint=step.taint,
    )
    if facts is None:
        checks: tuple[RuleCheck, ...] = ()
        verdict = policy.judge(
            tenant=state.tenant, tool=step.tool, arguments=step.arguments, at=judged_at
        )
    else:
        checks, verdict = policy.explain(facts)
    if step.requires_approval:
        verdict = as_the_plan_asks(verdict, policy)
    approval = state.approvals.get(step.approval_request_id or "")
    outcome = None
    if approval is not None:
        who = ", ".join(actor.id for actor in approval.decided_by)
        outcome = approval.status + (f" by {who}" if who else "")
        if approval.modified_arguments is not None:
            outcome += f", with modified arguments {json.dumps(approval.modified_arguments)}"
    return StepExplanation(
        step_id=step_id,
        call=f"{step.tool} {json.dumps(step.arguments, sort_keys=True)} (risk {verdict.risk})",
        requester=(
            f"{requester.id} (roles: {', '.join(requester.roles) or 'none'})"
            if requester is not None
            else "unknown"
        ),
        recorded=recorded,
        judged_at=judged_at,
        outcome=outcome,
        policy=policy,
        checks=checks,
        verdict=verdict,
    )


def explanation_lines(explanation: StepExplanation) -> list[str]:
    """The explanation as lines for the terminal."""
    lines = [
        f"step {explanation.step_id}: {explanation.call}",
        f"requested by {explanation.requester}",
    ]
    recorded = explanation.recorded
    if recorded is None:
        lines.append("recorded: no decision yet")
    else:
        lines.append(
            f"recorded: {_effect_of(recorded)} by rule {recorded.rule or '?'} "
            f"under policy {recorded.policy_hash or 'unrecorded'}"
        )
    if explanation.outcome is not None:
        lines.append(f"approval: {explanation.outcome}")
    policy = explanation.policy
    if explanation.same_policy:
        lines.append(f"policy {policy.source} ({policy.hash}) is the one it was decided under")
    else:
        lines.append(
            f"policy {policy.source} ({policy.hash}) is NOT the one it was decided under; "
            "below is how this policy judges the call"
        )
    lines.append(f"judged as of {explanation.judged_at.isoformat(timespec='seconds')}")
    for position, check in enumerate(explanation.checks, start=1):
        if check.failed is None:
            held = "; ".join(check.held) or "no conditions"
            lines.append(f"  {position}. {check.rule}: MATCHED ({held})")
        else:
            lines.append(f"  {position}. {check.rule}: skipped, {check.failed}")
    verdict = explanation.verdict
    asks = "request_permission, once granted " if verdict.missing else ""
    lines.append(f"verdict: {asks}{verdict.effect} by rule {verdict.rule}: {verdict.reason}")
    for need in verdict.missing:
        lines.append(f"  lacks {need.kind} {need.name}: {need.reason}")
    return lines


@dataclass(frozen=True)
class _Decided:
    data: Recorded
    time: datetime
    position: int
    """Its place among the session's events."""


def _first_decision(events: Sequence[Event], call_id: str) -> _Decided | None:
    # A step scheduled as its approved plan authorised it carries that decision.
    authorized = {event.id: call for event, call in authorizations(events)}
    for position, event in enumerate(events):
        data = authorized.get(event.id, event.data)
        if (
            isinstance(data, ApprovalRequested | ToolCallAuthorized | ToolCallDenied)
            and data.call_id == call_id
        ):
            return _Decided(data, event.time, position)
    return None


def _effect_of(recorded: Recorded) -> str:
    match recorded:
        case PermissionRequested():
            return "request_permission"
        case ApprovalRequested():
            return "require_approval"
        case ToolCallAuthorized():
            return "allow" if recorded.approval_request_id is None else "allow after approval"
        case ToolCallDenied():
            return "deny"
