"""A tool's `required_permission`: only a requester holding it may have the tool called;
rules may match it. Judged as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from helmline.approval import Policy, PolicyFileError, default_policy, parse_policy
from helmline.approval._policy import judge_plan, judge_step, judge_vote
from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    Actor,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    PlanApproved,
    PlanProposed,
    PlanStep,
    SessionStarted,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
    ToolCallFailed,
    ToolSpec,
    fold,
    new_event,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PUSH = ToolSpec(
    name="git__git_push",
    description="Push a branch.",
    parameters={
        "type": "object",
        "properties": {"branch": {"type": "string"}},
        "required": ["branch"],
        "additionalProperties": False,
    },
    risk="medium",
    executor="mcp",
    server="git",
    remote_name="git_push",
    required_permission="repo.write",
)
TOOLS = {**BUILTIN_TOOLS_BY_NAME, PUSH.name: PUSH}
WRITER = Actor(id="wes", roles=("operator", "repo.write"))
READER = Actor(id="rita", roles=("operator",))
NOBODY = Actor(id="nora")
APPROVER = Actor(id="ana", roles=("approver",))

DEFAULT = default_policy(TOOLS)
RULES = parse_policy(
    b"""
rules:
  - name: no-pushes-for-quarantine
    tenant: quarantine
    effect: deny
  - name: repo-writes-ask
    permission: 'repo.*'
    risk: high
    effect: require_approval
  - name: the-rest
    effect: allow
""",
    source="rules.yaml",
    tools=TOOLS,
)


def _push(branch: str = "main", risk: str | None = None, **extra: Any) -> StepScheduled:
    return StepScheduled.model_validate(
        {
            "step_id": "s",
            "call_id": "s.1",
            "tool": PUSH.name,
            "arguments": {"branch": branch, **extra},
            "risk": risk,
        }
    )


def _judged(
    scheduled: StepScheduled, policy: Policy, requester: Actor | None, tenant: str = "t"
) -> Any:
    (decision,) = judge_step(scheduled, policy, tenant=tenant, requester=requester, now=NOW)
    return decision.payload


@pytest.mark.parametrize(
    ("what", "policy", "tenant", "requester", "risk", "outcome", "rule"),
    [
        ("holder, default policy", DEFAULT, "t", WRITER, None, ToolCallAuthorized,
         "allow-low-and-medium-risk"),
        ("holder, raised risk asks", DEFAULT, "t", WRITER, "high", ApprovalRequested,
         "approve-high-and-critical-risk"),
        ("holder, an earlier deny rule", RULES, "quarantine", WRITER, None, ToolCallDenied,
         "no-pushes-for-quarantine"),
        ("holder, permission rule", RULES, "t", WRITER, "high", ApprovalRequested,
         "repo-writes-ask"),
        ("holder, the rest", RULES, "t", WRITER, None, ToolCallAuthorized, "the-rest"),
        ("lacking, default policy", DEFAULT, "t", READER, None, ToolCallDenied,
         "required-permission"),
        ("lacking, before any rule", RULES, "quarantine", READER, None, ToolCallDenied,
         "required-permission"),
        ("lacking, not asked about", RULES, "t", READER, "high", ToolCallDenied,
         "required-permission"),
        ("no roles", RULES, "t", NOBODY, None, ToolCallDenied, "required-permission"),
        ("unknown requester", RULES, "t", None, None, ToolCallDenied, "required-permission"),
    ],
)  # fmt: skip
def test_only_a_requester_holding_the_permission_reaches_the_rules(
    what: str,
    policy: Policy,
    tenant: str,
    requester: Actor | None,
    risk: str | None,
    outcome: type[Any],
    rule: str,
) -> None:
    payload = _judged(_push(risk=risk), policy, requester, tenant)
    assert isinstance(payload, outcome), what
    assert (payload.rule, payload.policy_hash) == (rule, policy.hash), what


def test_the_refusal_names_the_tool_the_permission_and_the_requester() -> None:
    denied = _judged(_push(), DEFAULT, READER)
    assert isinstance(denied, ToolCallDenied)
    assert (denied.call_id, denied.step_id, denied.tool) == ("s.1", "s", PUSH.name)
    assert denied.reason == (
        "tool 'git__git_push' requires the permission 'repo.write', "
        "which the requester rita (roles: operator) does not hold"
    )
    unknown = _judged(_push(), DEFAULT, None)
    assert unknown.reason == (
        "tool 'git__git_push' requires the permission 'repo.write', "
        "and who started the session is unknown"
    )


def test_arguments_that_cannot_run_still_fail_first_and_other_tools_are_judged_as_before() -> None:
    failed = _judged(_push(force=True), DEFAULT, READER)
    assert isinstance(failed, ToolCallFailed)
    assert failed.error.kind == "validation"
    echo = StepScheduled(step_id="e", call_id="e.1", tool="echo", arguments={"message": "x"})
    for requester in (None, READER):
        allowed = _judged(echo, RULES, requester)
        assert isinstance(allowed, ToolCallAuthorized)
        assert allowed.rule == "the-rest"


def test_the_requester_is_needed_only_for_tools_requiring_a_permission() -> None:
    assert DEFAULT.needs_requester(PUSH.name)
    assert not DEFAULT.needs_requester("echo")
    assert not DEFAULT.needs_requester("format_disk")
    by_role = parse_policy(b"rules: [{name: r, role: sre, effect: allow}]", source="r.yaml")
    assert by_role.needs_requester("echo")


def test_a_permission_condition_matches_the_tool_s_permission_and_explains_itself() -> None:
    def explained(tool: str, **arguments: Any) -> tuple[Any, ...]:
        facts = RULES.facts(
            tenant="t",
            tool=tool,
            arguments=arguments,
            declared_risk="high",
            requester=WRITER,
            at=datetime.now(UTC),
        )
        assert facts is not None
        return RULES.explain(facts)

    checks, verdict = explained(PUSH.name, branch="b")
    assert verdict.rule == "repo-writes-ask"
    assert checks[1].failed is None
    assert checks[1].held == ("risk is high", "the tool requires a permission matching 'repo.*'")
    checks, verdict = explained("echo", message="x")
    assert verdict.rule == "the-rest"
    assert checks[1].failed == "not: the tool requires a permission matching 'repo.*'"


def test_explain_tries_no_rule_for_a_requester_lacking_the_permission() -> None:
    facts = RULES.facts(
        tenant="t",
        tool=PUSH.name,
        arguments={"branch": "b"},
        declared_risk=None,
        requester=READER,
        at=datetime.now(UTC),
    )
    assert facts is not None
    checks, verdict = RULES.explain(facts)
    assert checks == ()
    assert (verdict.effect, verdict.rule) == ("deny", "required-permission")
    assert "rita" in verdict.reason


@pytest.mark.parametrize(
    ("permission", "problem"),
    [
        ("[]", "6: rules[0].permission: Value should have at least 1 item"),
        ("['repo.*', ' ']", "6: rules[0].permission: a permission glob must not be blank"),
        ("{a: b}", "6: rules[0].permission: Input should be a valid tuple"),
    ],
)
def test_a_permission_condition_is_checked_at_load(permission: str, problem: str) -> None:
    text = f"""
version: 1
rules:
  - name: r
    effect: allow
    permission: {permission}
"""
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(text.encode(), source="p.yaml")
    listed = [f"{p.line}: {p.field}: {p.message}" for p in caught.value.problems]
    assert any(line.startswith(problem) for line in listed), listed


ASK_PLANS_TEXT = b"""
plan_approval: {roles: [approver]}
rules:
  - name: pushes-ask
    tool: git__*
    effect: require_approval
  - name: the-rest
    effect: allow
"""
ASK_PLANS = parse_policy(ASK_PLANS_TEXT, source="plans.yaml", tools=TOOLS)


def _plan() -> PlanProposed:
    steps = (
        PlanStep(id="say", tool="echo", arguments={"message": "hi"}),
        PlanStep(id="s", tool=PUSH.name, arguments={"branch": "main"}),
    )
    return PlanProposed(revision=1, steps=steps)


def test_a_plan_asks_people_only_about_steps_the_requester_may_run() -> None:
    (asked,) = judge_plan(_plan(), ASK_PLANS, tenant="t", requester=WRITER, now=NOW)
    assert isinstance(asked.payload, ApprovalRequested)
    assert "s (git__git_push, rule pushes-ask)" in asked.payload.reason
    # Approving the plan could not let the push run for this requester: nobody is asked.
    (approved,) = judge_plan(_plan(), ASK_PLANS, tenant="t", requester=READER, now=NOW)
    assert isinstance(approved.payload, PlanApproved)


def test_a_person_approving_the_plan_or_the_call_cannot_grant_a_missing_permission() -> None:
    # The request was made while the registry asked no permission of the tool; a grant
    # after it started to is refused, for the plan's step and for the call's request alike.
    open_tools = {**TOOLS, PUSH.name: PUSH.model_copy(update={"required_permission": None})}
    before = parse_policy(ASK_PLANS_TEXT, source="plans.yaml", tools=open_tools)
    started = _started(READER)
    plan = _plan()
    (asked,) = judge_plan(plan, before, tenant="t", requester=READER, now=NOW)
    grant = ApprovalDecisionSubmitted(request_id="plan-1", decision="grant", decided_by=APPROVER)
    events = [started, *(started.derive(p, source="test") for p in (plan, asked.payload))]
    decisions = judge_vote(fold(events), grant, ASK_PLANS, NOW)
    events += [
        started.derive(d.payload, source="test", key=str(i)) for i, d in enumerate(decisions)
    ]
    state = fold(events)
    assert state.approvals["plan-1"].status == "granted"
    (planned,) = judge_step(
        _push(), ASK_PLANS, tenant="t", requester=READER, now=NOW, session=state, approved_plan=plan
    )
    assert isinstance(planned.payload, ToolCallDenied)
    assert planned.payload.rule == "required-permission"

    (request,) = judge_step(_push(), before, tenant="t", requester=READER, now=NOW)
    assert isinstance(request.payload, ApprovalRequested)
    vote = ApprovalDecisionSubmitted(request_id="s.1", decision="grant", decided_by=APPROVER)

    def judged_vote(requester: Actor) -> list[Any]:
        started = _started(requester)
        events = [started, *(started.derive(p, source="test") for p in (request.payload, vote))]
        return [d.payload for d in judge_vote(fold(events), vote, ASK_PLANS, NOW)]

    (refused,) = judged_vote(READER)
    assert isinstance(refused, ApprovalDecisionRefused)
    assert "by rule required-permission" in refused.reason
    assert "rita (roles: operator) does not hold" in refused.reason
    # The same request, in a session of a requester holding the permission, is granted.
    granted, authorized = judged_vote(WRITER)
    assert isinstance(granted, ApprovalGranted)
    assert isinstance(authorized, ToolCallAuthorized)


def _started(requester: Actor) -> Event:
    return new_event(
        SessionStarted(goal="g", requested_by=requester), tenant="t", session_id="x", source="test"
    )
