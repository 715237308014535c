"""How plans, steps, people's decisions and expiries are judged under a policy. Pure functions.

Every decision event records the rule that made it and the hash of the policy in force.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from helmline.approval._document import (
    DEFAULT_APPROVER_ROLES,
    MISSING_PERMISSION_RULE,
    PLAN_APPROVAL_RULE,
    STEERED_REPLAN_RULE,
    PermissionTerms,
)
from helmline.approval._rules import (
    NO_USES,
    RISK_ORDER,
    Policy,
    Verdict,
    arguments_meet,
    described,
    spoken,
)
from helmline.contracts import (
    Actor,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalState,
    ApprovalVoteCounted,
    Arguments,
    CallTaint,
    Event,
    Payload,
    PermissionKey,
    PermissionRequested,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    PlanStep,
    SessionState,
    StepAuthorization,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
    ToolCallFailed,
    call_digest,
    evolve,
    new_event,
    source_of,
)
from helmline.runtime import ArgumentChecker, StoredEvent, unknown_arguments

POLICY = Actor(id="policy", kind="policy")
NONE: frozenset[PermissionKey] = frozenset()
"""No permission granted on request."""
PLAN_STANDS_ALONE = (
    "the plan's approval stands for no later calls: drop similar_limit and similar_where"
)
"""Why a plan's approval cannot also approve similar calls."""
REQUEST_ID_LIMIT = 128
"""The longest request id the contracts take."""
SIMILAR_GRANT_DEFAULT = timedelta(hours=1)
"""How long an "approve similar calls" grant holds when the approver gives no end."""


@dataclass(frozen=True, slots=True)
class Decision:
    """An event to append, and what makes it unique when it must be stored once."""

    payload: Payload
    identity: str | None = None


def plan_request_id(revision: int) -> str:
    """The id of the request that asks for a plan revision to be approved."""
    return f"plan-{revision}"


def permission_request_id(call_id: str) -> str:
    """The id of the request that asks for the permissions a call lacks."""
    request_id = f"permission-{call_id}"
    if len(request_id) <= REQUEST_ID_LIMIT:
        return request_id
    return f"permission-{uuid.uuid5(uuid.NAMESPACE_URL, call_id).hex}"


def _planned_revision(request: ApprovalState) -> int | None:
    # The folded request does not keep the revision; its id, made by plan_request_id, does.
    prefix = plan_request_id(0)[:-1]
    if request.scope != "plan" or not request.request_id.startswith(prefix):
        return None
    number = request.request_id.removeprefix(prefix)
    return int(number) if number.isdigit() else None


def judge_plan(
    proposed: PlanProposed,
    policy: Policy,
    *,
    tenant: str = "",
    requester: Actor | None = None,
    now: datetime | None = None,
    earlier: Sequence[PlanStep] | None = None,
) -> list[Decision]:
    """Plans are approved, and each step judged when it is scheduled; unless the policy asks
    for plan approval and some steps would need a person: then the plan is asked about once,
    with those steps listed (not those denied, such as a tool whose permission `requester`
    lacks: approving the plan could not let them run).

    Tool output never adds steps on its own: given the steps of the session's `earlier`
    plans (a plan-mode session's replan), a revision that adds steps changing something
    after the model read content flagged as a suspected injection (`steered_steps`) waits
    for a person, whatever the policy's plan approval says.

    Judged at `now`, the approval authorises the calls of the steps that the policy allows
    whenever they are scheduled (`_authorized_steps`): those run without a decision of
    their own."""
    judged = _judged_steps(proposed, policy, tenant, requester, now) if now is not None else []
    approval = PlanApproved(
        revision=proposed.revision,
        approved_by=POLICY,
        policy_hash=policy.hash,
        authorized_steps=_authorized_steps(judged, policy, tenant),
    )
    approved = [Decision(approval, f"plan.approved/{proposed.revision}")]
    steered = steered_steps(proposed, earlier, policy) if earlier is not None else []
    terms = policy.document.plan_approval
    if now is None or (terms is None and not steered):
        return approved
    risky = [
        (step.id, step.tool, verdict)
        for step, verdict in judged
        if verdict.effect == "require_approval"
    ]
    if steered:
        return [Decision(_steered_request(proposed, steered, risky, policy, now), _asked(proposed))]
    if not risky or terms is None:
        return approved
    listed = "; ".join(f"{step_id} ({tool}, rule {v.rule})" for step_id, tool, v in risky)
    request = ApprovalRequested(
        request_id=plan_request_id(proposed.revision),
        scope="plan",
        revision=proposed.revision,
        risk=max((v.risk for _, _, v in risky), key=RISK_ORDER.index),
        reason=f"the plan has {len(risky)} steps that need approval: {listed}",
        rule=PLAN_APPROVAL_RULE,
        policy_hash=policy.hash,
        agent_reason=proposed.reasoning or None,
        approver_roles=terms.roles,
        quorum=terms.quorum,
        expires_at=now + terms.expires_in,
    )
    return [Decision(request, _asked(proposed))]


STEERING_EFFECTS = frozenset({"workspace", "external"})
"""What a step must be able to change for a suspected injection to hold its plan."""


def steered_steps(
    proposed: PlanProposed, earlier: Iterable[PlanStep], policy: Policy
) -> list[PlanStep]:
    """The steps a revised plan adds (no earlier plan of the session had the same call) that
    change something (their tool's effect is on the workspace or outside) and that the model
    proposed after reading content flagged as a suspected injection: control flow that
    untrusted data may have bent."""
    before = {(step.tool, _canonical(step.arguments)) for step in earlier}
    steered = []
    for step in proposed.steps:
        spec = policy.tools.get(step.tool)
        if (
            step.taint is not None
            and step.taint.after_injection_suspected
            and spec is not None
            and spec.effect in STEERING_EFFECTS
            and (step.tool, _canonical(step.arguments)) not in before
        ):
            steered.append(step)
    return steered


def _canonical(arguments: Arguments) -> str:
    return json.dumps(arguments, sort_keys=True)


def _asked(proposed: PlanProposed) -> str:
    return f"plan.asked/{proposed.revision}"


def _judged_steps(
    proposed: PlanProposed, policy: Policy, tenant: str, requester: Actor | None, now: datetime
) -> list[tuple[PlanStep, Verdict]]:
    """The plan's steps, each with the verdict its call would get if scheduled `now`."""
    judged = []
    for step in proposed.steps:
        verdict = policy.judge(
            tenant=tenant,
            tool=step.tool,
            arguments=step.arguments,
            declared_risk=step.risk,
            requester=requester,
            at=now,
            hosts=step.hosts,
            taint=step.taint,
        )
        if step.requires_approval:
            verdict = as_the_plan_asks(verdict, policy)
        judged.append((step, verdict))
    return judged


def _authorized_steps(
    judged: Iterable[tuple[PlanStep, Verdict]], policy: Policy, tenant: str
) -> tuple[StepAuthorization, ...]:
    """The steps whose calls the policy allows now and would allow whenever scheduled: the
    verdict is an outright allow (no person, nothing lacking), no rule that may decide the
    tool reads the time or counts calls, the model read nothing untrusted before proposing
    it, and its arguments are valid. Anything else is judged when scheduled."""
    authorized = []
    for step, verdict in judged:
        spec = policy.tools.get(step.tool)
        if (
            verdict.effect == "allow"
            and not verdict.missing
            and step.taint is None
            and spec is not None
            and _ARGUMENTS.problem(spec, step.arguments) is None
            and policy.judges_alike_whenever(tenant=tenant, tool=step.tool)
        ):
            authorized.append(
                StepAuthorization(
                    step_id=step.id,
                    call_digest=call_digest(step.tool, step.arguments),
                    risk=verdict.risk,
                    rule=verdict.rule,
                    sandbox_profile=verdict.sandbox_profile,
                    network=verdict.network,
                )
            )
    return tuple(authorized)


def _steered_request(
    proposed: PlanProposed,
    steered: Sequence[PlanStep],
    risky: Sequence[tuple[str, str, Verdict]],
    policy: Policy,
    now: datetime,
) -> ApprovalRequested:
    """The request a steered revision waits on: approving it approves the whole plan (its
    steps then run unchanged without asking again), so it names the steered steps, those
    the policy would have asked about anyway, and the flagged results."""
    terms = policy.document.plan_approval or policy.default_approval
    added = ", ".join(f"{step.id} ({step.tool})" for step in steered)
    reason = (
        f"plan revision {proposed.revision} adds steps that change something after the "
        f"model read content flagged as a suspected prompt injection: {added}"
    )
    ids = {step.id for step in steered}
    others = [
        f"{step_id} ({tool}, rule {v.rule})" for step_id, tool, v in risky if step_id not in ids
    ]
    if others:
        reason += f"; steps that need approval anyway: {'; '.join(others)}"
    # The flagged results are the same for every step of one answer: the first step's
    # taint names them (and where its own arguments came from).
    taint = steered[0].taint
    risks = [v.risk for _, _, v in risky] + [policy.tools[step.tool].risk for step in steered]
    return ApprovalRequested(
        request_id=plan_request_id(proposed.revision),
        scope="plan",
        revision=proposed.revision,
        risk=max(risks, key=RISK_ORDER.index),
        reason=_with_sources(reason, taint),
        rule=STEERED_REPLAN_RULE,
        policy_hash=policy.hash,
        agent_reason=proposed.reasoning or None,
        approver_roles=terms.roles,
        quorum=terms.quorum,
        expires_at=now + terms.expires_in,
        taint=taint,
    )


_ARGUMENTS = ArgumentChecker()
"""Compiled argument schemas of the tools judged, shared by every policy in force."""


def uses_by_rule(events: Iterable[Event]) -> dict[str, tuple[datetime, ...]]:
    """When the calls among `events` (a session's, oldest first) were authorised, by the
    rule that let them run: what `at_most` conditions count."""
    uses: dict[str, list[datetime]] = {}
    for event in events:
        if isinstance(event.data, ToolCallAuthorized) and event.data.rule is not None:
            uses.setdefault(event.data.rule, []).append(event.time)
    return {rule: tuple(times) for rule, times in uses.items()}


def judge_step(
    scheduled: StepScheduled,
    policy: Policy,
    *,
    tenant: str,
    requester: Actor | None,
    now: datetime,
    session: SessionState | None = None,
    approved_plan: PlanProposed | None = None,
    rule_uses: Mapping[str, Sequence[datetime]] = NO_USES,
) -> list[Decision]:
    """Allow, deny or ask a person, as the first matching rule says; a tool that requires a
    permission the requester lacks (or an unknown requester) is denied before any rule.
    `rule_uses` are when the session's earlier calls ran, by rule (`uses_by_rule`), for
    `at_most` conditions.

    Given the session, a call that would be sent to approval runs at once under a standing
    "approve similar calls" grant of the same rule and tool that has uses and time left, or
    when a person approved the plan (`approved_plan`) and the call is its step unchanged;
    and the permissions people granted the session on request count as held.

    A call that lacks a permission the policy lets people grant (`permission_requests`) asks
    for it (`permission.requested`), whatever the rules would then decide (but deny).
    """
    identity = f"judged/{scheduled.call_id}"
    spec = policy.tools.get(scheduled.tool)
    problem = _ARGUMENTS.problem(spec, scheduled.arguments) if spec is not None else None
    if problem is not None:
        # Arguments that cannot run are refused before policy is asked (or a person).
        failed = ToolCallFailed(
            call_id=scheduled.call_id, step_id=scheduled.step_id, tool=scheduled.tool, error=problem
        )
        return [Decision(failed, identity)]
    verdict = policy.judge(
        tenant=tenant,
        tool=scheduled.tool,
        arguments=scheduled.arguments,
        declared_risk=scheduled.risk,
        requester=requester,
        at=now,
        rule_uses=rule_uses,
        hosts=scheduled.hosts,
        granted=(
            session.granted_permissions(scheduled.step_id, now) if session is not None else NONE
        ),
        taint=scheduled.taint,
    )
    terms = policy.document.permission_requests
    if verdict.missing and terms is not None:
        asked = _permission_request(scheduled, verdict, policy.hash, terms, now, session)
        return [Decision(asked, identity)]
    if scheduled.requires_approval:
        verdict = as_the_plan_asks(verdict, policy)
    # Decisions name the MCP tool's definition they were made for: a grant stands for it only.
    digest = spec.definition_digest if spec is not None else None
    payload: Payload
    match verdict.effect:
        case "deny":
            payload = ToolCallDenied(
                call_id=scheduled.call_id,
                step_id=scheduled.step_id,
                tool=scheduled.tool,
                reason=verdict.reason,
                rule=verdict.rule,
                policy_hash=policy.hash,
            )
        case "allow":
            payload = _authorized(scheduled, verdict, policy.hash, digest)
        case "require_approval" if (
            standing := _standing_grant(session, scheduled, verdict.rule, digest, now)
            or _plan_grant(session, approved_plan, scheduled)
        ) is not None:
            payload = _authorized(scheduled, verdict, policy.hash, digest, standing.request_id)
        case "require_approval":
            assert verdict.approval is not None
            payload = ApprovalRequested(
                request_id=scheduled.call_id,
                scope="step",
                step_id=scheduled.step_id,
                call_id=scheduled.call_id,
                tool=scheduled.tool,
                arguments=scheduled.arguments,
                risk=verdict.risk,
                reason=_with_sources(verdict.reason, scheduled.taint),
                rule=verdict.rule,
                policy_hash=policy.hash,
                approver_roles=verdict.approval.roles,
                quorum=verdict.approval.quorum,
                expires_at=now + verdict.approval.expires_in,
                agent_reason=_stated_reason(session, scheduled.step_id),
                taint=scheduled.taint,
                definition_digest=digest,
            )
    return [Decision(payload, identity)]


def _permission_request(
    scheduled: StepScheduled,
    verdict: Verdict,
    policy_hash: str,
    terms: PermissionTerms,
    now: datetime,
    session: SessionState | None,
) -> PermissionRequested:
    tool_permission = any(need.kind == "tool" for need in verdict.missing)
    return PermissionRequested(
        request_id=permission_request_id(scheduled.call_id),
        scope="step",
        step_id=scheduled.step_id,
        call_id=scheduled.call_id,
        tool=scheduled.tool,
        arguments=scheduled.arguments,
        risk=verdict.risk,
        reason=f"the call needs {described(verdict.missing)}",
        # Why it asks: the tool's permission, else the rule that would decide the call.
        rule=MISSING_PERMISSION_RULE if tool_permission else verdict.rule,
        policy_hash=policy_hash,
        approver_roles=terms.roles,
        quorum=terms.quorum,
        expires_at=now + terms.expires_in,
        agent_reason=_stated_reason(session, scheduled.step_id),
        permissions=verdict.missing,
        taint=scheduled.taint,
    )


def _with_sources(reason: str, taint: CallTaint | None) -> str:
    """The reason a call waits, and the untrusted results its arguments came from or that
    were flagged as suspected injections: what an approver must read first."""
    if taint is None or not taint.sources:
        return reason
    return f"{reason}. {taint.described()}"


def as_the_plan_asks(verdict: Verdict, policy: Policy) -> Verdict:
    """A call its plan asks a person about: what the policy allows waits for a person, on
    the policy's default approval terms; what it denies or sends to a person stays so."""
    if verdict.effect != "allow":
        return verdict
    reason = f"the plan asks a person to approve this step (rule {verdict.rule} would allow it)"
    return replace(
        verdict, effect="require_approval", reason=reason, approval=policy.default_approval
    )


def _authorized(
    scheduled: StepScheduled,
    verdict: Verdict,
    policy_hash: str,
    definition_digest: str | None,
    approval_request_id: str | None = None,
) -> ToolCallAuthorized:
    return ToolCallAuthorized(
        call_id=scheduled.call_id,
        step_id=scheduled.step_id,
        tool=scheduled.tool,
        arguments=scheduled.arguments,
        risk=verdict.risk,
        rule=verdict.rule,
        policy_hash=policy_hash,
        approval_request_id=approval_request_id,
        sandbox_profile=verdict.sandbox_profile,
        network=verdict.network,
        definition_digest=definition_digest,
    )


def _stated_reason(session: SessionState | None, step_id: str) -> str | None:
    # What the plan says the step is for, so that approvers see why the agent wants it.
    step = session.steps.get(step_id) if session is not None else None
    if step is None or not step.description:
        return None
    return step.description


def _plan_grant(
    session: SessionState | None, plan: PlanProposed | None, scheduled: StepScheduled
) -> ApprovalState | None:
    if session is None or plan is None:
        return None
    request = session.approvals.get(plan_request_id(plan.revision))
    if request is None or request.status != "granted":
        return None
    planned = next((step for step in plan.steps if step.id == scheduled.step_id), None)
    if planned is None or (planned.tool, planned.arguments) != (
        scheduled.tool,
        scheduled.arguments,
    ):
        return None  # People approved the plan's call, not this one.
    return request


def _standing_grant(
    session: SessionState | None,
    scheduled: StepScheduled,
    rule: str,
    definition_digest: str | None,
    now: datetime,
) -> ApprovalState | None:
    """The "approve similar calls" grant that approves this call too: of the same rule and
    tool, with uses and time left, for the tool's definition as it is listed now (a tool
    changed since, even one an operator accepted, asks a person again), and whose conditions
    on arguments the call meets."""
    if session is None:
        return None
    for request in session.approvals.values():
        if (
            request.status == "granted"
            and request.similar_limit is not None
            and request.similar_used < request.similar_limit
            and (request.similar_until is None or now < request.similar_until)
            and request.tool == scheduled.tool
            and request.rule == rule
            and request.definition_digest == definition_digest
            and arguments_meet(request.similar_where or {}, scheduled.arguments)
        ):
            return request
    return None


def judge_vote(
    state: SessionState,
    vote: ApprovalDecisionSubmitted,
    policy: Policy,
    now: datetime,
    rule_uses: Mapping[str, Sequence[datetime]] = NO_USES,
) -> list[Decision]:
    """What a person's decision on a pending request leads to; never nothing, so that
    whoever decided learns the outcome from the log (granted, denied, counted or refused).
    `rule_uses`: the session's earlier calls by rule, as for `judge_step`.

    One denial by someone allowed to decide denies the request. Grants count once per
    person, and only grants of the very same arguments (and "approve similar" scope) count
    together, so the quorum is of people who approved exactly what runs. Modified arguments
    must fit the tool's schema and still be allowed, or need approval under the same rule,
    by the policy in force; so a grant never runs a tool whose permission the session's
    requester lacks.
    """
    request = state.approvals.get(vote.request_id)
    voter = vote.decided_by
    if request is None:
        return _refuse(vote, f"no approval request {vote.request_id}")
    if request.status != "pending":
        return _refuse(vote, f"request {request.request_id} is already {request.status}")
    roles = request.approver_roles or DEFAULT_APPROVER_ROLES
    if not _may_decide(voter, roles):
        return _refuse(
            vote, f"{voter.id} holds none of the roles that may decide ({', '.join(roles)})"
        )
    if vote.decision == "deny":
        reason = f"denied by {voter.id}" + (f": {vote.comment}" if vote.comment else "")
        denied = ApprovalDenied(
            request_id=request.request_id, decided_by=voter, comment=vote.comment
        )
        return [
            Decision(denied, f"decided/{request.request_id}"),
            *_deny_call(request, reason, policy.hash),
            *_reject_plan(request, reason, voter, policy.hash),
        ]
    if request.permissions:
        return _grant_permissions(state, request, vote, policy, now, rule_uses, roles)
    if vote.grant_scope is not None or vote.grant_until is not None:
        return _refuse(
            vote,
            f"grant_scope and grant_until are for permission requests; {request.request_id} "
            "asks to approve a call: grant it without them",
        )
    scope_problem = _similar_scope_problem(request, vote, policy)
    if scope_problem is not None:
        return _refuse(vote, scope_problem)
    arguments = vote.modified_arguments
    if arguments is None:
        arguments = request.arguments or {}
    authorized: ToolCallAuthorized | None = None
    if request.call_id is not None and request.step_id is not None and request.tool:
        problem = _modified_arguments_problem(request, vote, policy)
        if problem is not None:
            return _refuse(vote, problem)
        outcome = _granted_call(state, request, arguments, policy, now, rule_uses)
        if isinstance(outcome, str):
            advice = (
                "grant it with other arguments, or deny it"
                if vote.modified_arguments is not None
                else "deny it or let it expire"
            )
            return _refuse(vote, f"{outcome}; {advice}")
        authorized = outcome
    granters = _granters(request, vote, roles)
    if len(granters) < request.quorum:
        counted = ApprovalVoteCounted(
            request_id=request.request_id,
            decided_by=voter,
            grants=len(granters),
            quorum=request.quorum,
        )
        return [Decision(counted)]
    similar_until = None
    if vote.similar_limit is not None:
        similar_until = vote.similar_until or now + SIMILAR_GRANT_DEFAULT
    granted = ApprovalGranted(
        request_id=request.request_id,
        decided_by=granters,
        comment=vote.comment,
        modified_arguments=vote.modified_arguments,
        similar_limit=vote.similar_limit,
        similar_until=similar_until,
        similar_where=vote.similar_where,
    )
    decisions = [Decision(granted, f"decided/{request.request_id}")]
    if authorized is not None and not (state.status == "paused" and state.plan_step_of(request)):
        # Paused, no new step starts: the grant stands, and `judge_release` lets the call
        # run when the session resumes.
        decisions.append(Decision(authorized, f"outcome/{request.request_id}"))
    revision = _planned_revision(request)
    if revision is not None:
        approval = PlanApproved(revision=revision, approved_by=granters[0], policy_hash=policy.hash)
        decisions.append(Decision(approval, f"plan.approved/{revision}"))
    return decisions


def _grant_permissions(
    state: SessionState,
    request: ApprovalState,
    vote: ApprovalDecisionSubmitted,
    policy: Policy,
    now: datetime,
    rule_uses: Mapping[str, Sequence[datetime]],
    roles: tuple[str, ...],
) -> list[Decision]:
    """A person's grant of a permission request: counted towards its quorum, then recorded
    with what it stands for (the step or the session) and until when; the call is judged
    again with the permissions held (unless its session is paused: `judge_release` judges
    it when the session resumes)."""
    terms = policy.document.permission_requests
    if terms is None:
        return _refuse(
            vote, "the policy in force lets nobody grant permissions on request any more; deny it"
        )
    if (
        vote.modified_arguments is not None
        or vote.similar_limit is not None
        or vote.similar_where is not None
    ):
        return _refuse(
            vote,
            "a permission request is granted as asked, for the step or the session: "
            "drop modified arguments and similar calls",
        )
    until = vote.grant_until or now + terms.grant_expires_in
    if until <= now:
        return _refuse(vote, f"grant_until {until.isoformat()} is not in the future")
    if until > now + terms.grant_at_most:
        return _refuse(
            vote,
            f"the policy lets a permission be granted for at most {spoken(terms.grant_at_most)}: "
            "give an earlier grant_until",
        )
    granters = _granters(request, vote, roles)
    if len(granters) < request.quorum:
        counted = ApprovalVoteCounted(
            request_id=request.request_id,
            decided_by=vote.decided_by,
            grants=len(granters),
            quorum=request.quorum,
        )
        return [Decision(counted)]
    scope = vote.grant_scope or "step"
    granted = ApprovalGranted(
        request_id=request.request_id,
        decided_by=granters,
        comment=vote.comment,
        grant_scope=scope,
        grant_until=until,
    )
    decisions = [Decision(granted, f"decided/{request.request_id}")]
    # The session as the grant leaves it, folded as the log will fold it (approval facts
    # enter a state one way): the call is judged again with the permissions now held.
    after = evolve(state, _as_event(state, granted, now))
    held = after.approvals[request.request_id]
    if not (after.status == "paused" and after.plan_step_of(held)):
        decisions += _judged_again(after, held, policy, now, rule_uses)
    return decisions


def _as_event(state: SessionState, data: Payload, now: datetime) -> Event:
    """`data` as an event of the session at `now`, to fold before it is appended."""
    return new_event(
        data,
        tenant=state.tenant,
        session_id=state.session_id,
        source=source_of("approval"),
        event_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{state.session_id}/{data.TYPE}"),
        at=now,
    )


def _judged_again(
    state: SessionState,
    request: ApprovalState,
    policy: Policy,
    now: datetime,
    rule_uses: Mapping[str, Sequence[datetime]],
) -> list[Decision]:
    """The call of a granted permission request, judged again now that the session holds
    the permissions granted: the rules decide it (allow, ask a person, deny). A call that
    still lacks one (the policy changed, or the grant ended) is denied, not asked about
    again."""
    # Callers pass requests for a call only.
    assert request.call_id is not None
    assert request.step_id is not None
    assert request.tool
    step = state.plan_step_of(request)
    scheduled = StepScheduled(
        step_id=request.step_id,
        call_id=request.call_id,
        tool=request.tool,
        arguments=request.arguments or {},
        risk=request.risk,
        requires_approval=step.requires_approval if step is not None else False,
        hosts=step.hosts if step is not None else (),
        taint=step.taint if step is not None else None,
    )
    (judged,) = judge_step(
        scheduled,
        policy,
        tenant=state.tenant,
        requester=state.requested_by,
        now=now,
        session=state,
        rule_uses=rule_uses,
    )
    if isinstance(judged.payload, PermissionRequested):
        lacking = ", ".join(f"{need.kind} {need.name}" for need in judged.payload.permissions)
        reason = f"the permissions were granted, but the call still lacks {lacking}"
        return _deny_call(request, reason, policy.hash)
    return [Decision(judged.payload, f"outcome/{request.request_id}")]


def _granted_call(
    state: SessionState,
    request: ApprovalState,
    arguments: Arguments,
    policy: Policy,
    now: datetime,
    rule_uses: Mapping[str, Sequence[datetime]],
) -> ToolCallAuthorized | str:
    """The authorisation of the call of `request` granted with `arguments`, or why the
    policy in force does not let a person approve it: no longer (it changed since the
    request), or not with the arguments the person gave instead."""
    # Callers pass requests for a call only (not a plan's).
    assert request.call_id is not None
    assert request.step_id is not None
    assert request.tool
    verdict = policy.judge(
        tenant=state.tenant,
        tool=request.tool,
        arguments=arguments,
        declared_risk=request.risk,
        requester=state.requested_by,
        at=now,
        rule_uses=rule_uses,
        # Judged as it was asked about: without its taint, a tainted call of a high-risk
        # tool would fall to another rule than the one that asked, and the grant be refused.
        taint=request.taint,
    )
    if verdict.effect == "deny" or (
        verdict.effect == "require_approval" and verdict.rule != request.rule
    ):
        how = "with these arguments" if arguments != (request.arguments or {}) else "any longer"
        return (
            f"the policy in force does not let a person approve this call {how} "
            f"({verdict.effect} by rule {verdict.rule}: {verdict.reason})"
        )
    return ToolCallAuthorized(
        call_id=request.call_id,
        step_id=request.step_id,
        tool=request.tool,
        arguments=arguments,
        risk=request.risk,
        rule=request.rule,
        policy_hash=policy.hash,
        approval_request_id=request.request_id,
        sandbox_profile=verdict.sandbox_profile,
        network=verdict.network,
        # What the person was asked about: the gateway refuses the call if it changed since.
        definition_digest=request.definition_digest,
    )


def judge_release(
    state: SessionState,
    request: ApprovalState,
    policy: Policy,
    now: datetime,
    rule_uses: Mapping[str, Sequence[datetime]] = NO_USES,
) -> list[Decision]:
    """The call of a request granted while its session was paused, now that the session is
    no longer paused: authorised with the arguments granted, as the grant would have if the
    session had been running; denied if the policy in force no longer lets it run."""
    if state.status == "paused" or request not in state.held_grants:
        return []
    if request.permissions:
        return _judged_again(state, request, policy, now, rule_uses)
    arguments = request.modified_arguments
    if arguments is None:
        arguments = request.arguments or {}
    outcome = _granted_call(state, request, arguments, policy, now, rule_uses)
    if isinstance(outcome, str):
        reason = f"granted while the session was paused, but when it resumed {outcome}"
        return _deny_call(request, reason, policy.hash)
    return [Decision(outcome, f"outcome/{request.request_id}")]


def judge_vote_again(
    before: SessionState,
    vote: ApprovalDecisionSubmitted,
    policy: Policy,
    now: datetime,
    recorded: Sequence[Payload],
    rule_uses: Mapping[str, Sequence[datetime]] = NO_USES,
) -> list[Decision]:
    """A vote delivered again, judged as it was first: against the session `before` it
    (whose earlier calls ran as `rule_uses` says), given what the log already holds of its
    decisions (`recorded`).

    Should the log hold its grant while the policy in force would now refuse it (the policy
    changed between the grant's recording and the rest, or other calls used up an `at_most`
    count meanwhile), the grant stands and the call it would have released is denied: the
    session must not wait for an authorisation that never comes, and what the policy now
    refuses does not run."""
    decisions = judge_vote(before, vote, policy, now, rule_uses)
    granted = any(isinstance(payload, ApprovalGranted) for payload in recorded)
    if not granted or any(isinstance(d.payload, ApprovalGranted) for d in decisions):
        return decisions
    refusals = [d.payload for d in decisions if isinstance(d.payload, ApprovalDecisionRefused)]
    why = refusals[0].reason if refusals else "the policy in force no longer allows it"
    reason = f"granted, but the policy refused the call when it was to run: {why}"
    return _deny_call(before.approvals[vote.request_id], reason, policy.hash)


def _refuse(vote: ApprovalDecisionSubmitted, reason: str) -> list[Decision]:
    refused = ApprovalDecisionRefused(
        request_id=vote.request_id, decided_by=vote.decided_by, reason=reason
    )
    return [Decision(refused)]


def _may_decide(actor: Actor, roles: tuple[str, ...]) -> bool:
    return not set(actor.roles).isdisjoint(roles)


def _granters(
    request: ApprovalState, vote: ApprovalDecisionSubmitted, roles: tuple[str, ...]
) -> tuple[Actor, ...]:
    # The state folded for this vote normally holds it already; a caller may not have.
    votes = request.votes if vote in request.votes else (*request.votes, vote)
    granters: dict[str, Actor] = {}
    for earlier in votes:
        if (
            earlier.decision == "grant"
            and earlier.modified_arguments == vote.modified_arguments
            and (earlier.similar_limit, earlier.similar_until, earlier.similar_where)
            == (vote.similar_limit, vote.similar_until, vote.similar_where)
            # Grants of a permission count together whatever end each gave: the last decides.
            and earlier.grant_scope == vote.grant_scope
            and _may_decide(earlier.decided_by, roles)
        ):
            granters.setdefault(earlier.decided_by.id, earlier.decided_by)
    return tuple(granters.values())


def _similar_scope_problem(
    request: ApprovalState, vote: ApprovalDecisionSubmitted, policy: Policy
) -> str | None:
    """Why the standing grant a vote asks for, or the conditions it is limited to, cannot
    stand, if they cannot."""
    if request.tool is None:
        asked = vote.similar_limit is not None or vote.similar_where is not None
        return PLAN_STANDS_ALONE if asked else None
    if vote.similar_where is None:
        return None
    if vote.similar_limit is None:
        return 'similar_where limits an "approve similar" grant: give similar_limit too'
    spec = policy.tools.get(request.tool)
    unknown = unknown_arguments(spec, vote.similar_where) if spec else sorted(vote.similar_where)
    if unknown:
        return f"{request.tool} has no argument {', '.join(map(repr, unknown))} to limit to"
    return None


def _modified_arguments_problem(
    request: ApprovalState, vote: ApprovalDecisionSubmitted, policy: Policy
) -> str | None:
    if vote.modified_arguments is None or request.tool is None:
        return None
    spec = policy.tools.get(request.tool)
    if spec is None:
        return f"modified arguments for unknown tool {request.tool!r}"
    problem = _ARGUMENTS.problem(spec, vote.modified_arguments)
    if problem is None:
        return None
    where = f"{request.tool}'s schema at {problem.field}"
    return f"modified arguments do not fit {where}: {problem.message}"


ApprovalDecided = ApprovalGranted | ApprovalDenied
"""A person's decision of a request, which leaves its timers nothing to do."""


def requests_to_watch(asked: Iterable[StoredEvent], settling: Iterable[StoredEvent]) -> list[Event]:
    """The requests among `asked` (`approval.requested`, as stored) whose expiry or escalation
    may still have something to do, given the grants, denials and session ends among
    `settling`: those neither granted nor denied since, nor withdrawn by their session's end.
    An expired request stays: its timer finishes an expiry recorded in part."""
    last: dict[tuple[str, str, str | None], int] = {}
    for stored in settling:
        event = stored.event
        request_id = event.data.request_id if isinstance(event.data, ApprovalDecided) else None
        key = (event.tenant, event.session_id, request_id)
        last[key] = max(last.get(key, 0), stored.seq)
    watched = []
    for stored in asked:
        event = stored.event
        if not isinstance(event.data, ApprovalRequested):
            continue
        decided = last.get((event.tenant, event.session_id, event.data.request_id), 0)
        ended = last.get((event.tenant, event.session_id, None), 0)
        if max(decided, ended) < stored.seq:
            watched.append(event)
    return watched


def judge_expiry(
    state: SessionState, request_id: str, now: datetime, policy: Policy
) -> list[Decision]:
    """An unanswered request past its expiry becomes a denial."""
    request = state.approvals.get(request_id)
    if request is None or request.status != "pending" or request.expires_at > now:
        return []
    asked = "permission" if request.permissions else "approval"
    return [
        Decision(ApprovalExpired(request_id=request_id), f"decided/{request_id}"),
        *_deny_call(request, f"nobody decided before the {asked} request expired", policy.hash),
        *_reject_plan(
            request, "nobody approved the plan before the request expired", POLICY, policy.hash
        ),
    ]


def judge_escalation(
    state: SessionState, request: ApprovalRequested, policy: Policy, now: datetime
) -> list[Decision]:
    """Ask a pending request again of the rule's `escalate_to` roles once `escalate_after`
    has passed; its expiry stays. Votes made before the escalation start over."""
    terms = policy.approval_terms(request.rule)
    pending = state.approvals.get(request.request_id)
    if (
        terms is None
        or terms.escalate_after is None
        or pending is None
        or pending.status != "pending"
        or pending.approver_roles == terms.escalate_to
        or now < pending.requested_at + terms.escalate_after
    ):
        return []
    escalated = request.model_copy(
        update={
            "approver_roles": terms.escalate_to,
            "reason": f"escalated: nobody of {', '.join(pending.approver_roles)} decided "
            f"within {terms.escalate_after}; {request.reason}",
            "policy_hash": policy.hash,
        }
    )
    return [Decision(escalated, f"escalated/{request.request_id}")]


def _reject_plan(
    request: ApprovalState, reason: str, by: Actor, policy_hash: str
) -> list[Decision]:
    revision = _planned_revision(request)
    if revision is None:
        return []
    rejection = PlanRejected(
        revision=revision, reason=reason, rejected_by=by, policy_hash=policy_hash
    )
    return [Decision(rejection, f"outcome/{request.request_id}")]


def _deny_call(request: ApprovalState, reason: str, policy_hash: str) -> list[Decision]:
    if request.call_id is None or request.step_id is None or not request.tool:
        return []
    denial = ToolCallDenied(
        call_id=request.call_id,
        step_id=request.step_id,
        tool=request.tool,
        reason=reason,
        rule=request.rule,
        policy_hash=policy_hash,
        approval_request_id=request.request_id,
    )
    return [Decision(denial, f"outcome/{request.request_id}")]
