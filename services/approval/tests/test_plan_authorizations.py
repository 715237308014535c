"""A plan approved by policy authorises the calls of the steps whose verdict cannot change
before they are scheduled: those run without a decision of their own."""

from __future__ import annotations

from datetime import UTC, datetime

from helmline.approval import parse_policy
from helmline.approval._policy import judge_plan, judge_step
from helmline.contracts import (
    Actor,
    CallTaint,
    PlanApproved,
    PlanProposed,
    PlanStep,
    StepScheduled,
    ToolCallAuthorized,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
ANA = Actor(id="ana", roles=("approver",))

POLICY = parse_policy(
    b"""
rules:
  - name: no-secrets
    tool: read_file
    arguments:
      path: {glob: '.env*'}
    effect: deny
  - name: reads-in-office-hours
    tool: read_file
    during: {hours: 00:00-24:00}
    effect: allow
  - name: a-few-writes
    tool: write_file
    at_most: {calls: 5, per: 1h}
    effect: allow
  - name: commands-ask
    tool: run_command
    effect: require_approval
  - name: listings-reach-the-docs
    tool: list_files
    hosts: [docs.example.com]
    effect: allow
    sandbox_profile: fetcher
  - name: the-rest
    effect: allow
""",
    source="plan-authorizations.yaml",
)

STEPS = (
    PlanStep(id="say", tool="echo", arguments={"message": "hi"}),
    PlanStep(id="say-high", tool="echo", arguments={"message": "hi"}, risk="high"),
    PlanStep(id="secrets", tool="read_file", arguments={"path": ".env"}),
    PlanStep(id="read", tool="read_file", arguments={"path": "notes.txt"}),
    PlanStep(id="write", tool="write_file", arguments={"path": "a", "content": "b"}),
    PlanStep(id="run", tool="run_command", arguments={"command": "ls"}),
    PlanStep(id="asked", tool="echo", arguments={"message": "hi"}, requires_approval=True),
    PlanStep(
        id="tainted",
        tool="echo",
        arguments={"message": "hi"},
        taint=CallTaint(influenced_by_untrusted=True),
    ),
    PlanStep(id="invalid", tool="echo", arguments={"message": 7}),
    PlanStep(id="list", tool="list_files", arguments={"path": "a"}, hosts=("docs.example.com",)),
)


def _approval(*steps: PlanStep) -> PlanApproved:
    (decision,) = judge_plan(
        PlanProposed(revision=1, steps=steps), POLICY, tenant="t", requester=ANA, now=NOW
    )
    assert isinstance(decision.payload, PlanApproved)
    return decision.payload


def _scheduled(step: PlanStep, authorized_by_plan: int | None = 1) -> StepScheduled:
    return StepScheduled(
        step_id=step.id,
        call_id=f"{step.id}.1",
        tool=step.tool,
        arguments=step.arguments,
        risk=step.risk,
        requires_approval=step.requires_approval,
        hosts=step.hosts,
        taint=step.taint,
        authorized_by_plan=authorized_by_plan,
    )


def test_only_calls_whose_verdict_cannot_change_before_they_are_scheduled_are_authorised() -> None:
    approval = _approval(*STEPS)
    # Not: a denial, a time window, a count, a person, taint, arguments that cannot run.
    assert [a.step_id for a in approval.authorized_steps] == ["say", "say-high", "list"]


def test_an_authorisation_with_the_plan_is_the_decision_the_step_would_get_when_scheduled() -> None:
    approval = _approval(*STEPS)
    for authorization in approval.authorized_steps:
        step = next(s for s in STEPS if s.id == authorization.step_id)
        (judged,) = judge_step(_scheduled(step, None), POLICY, tenant="t", requester=ANA, now=NOW)
        assert isinstance(judged.payload, ToolCallAuthorized)
        assert _scheduled(step).authorized_by(approval) == judged.payload
    listing = approval.authorization_of("list", "list_files", {"path": "a"})
    assert listing is not None
    assert (listing.rule, listing.sandbox_profile, listing.network) == (
        "listings-reach-the-docs",
        "fetcher",
        True,
    )
    assert approval.authorized_steps[1].risk == "high"


def test_a_step_scheduled_otherwise_than_its_plan_authorised_is_not_authorised_by_it() -> None:
    say = STEPS[0]
    approval = _approval(say)
    assert _scheduled(say).authorized_by(approval) is not None
    changed = _scheduled(say).model_copy(update={"arguments": {"message": "something else"}})
    assert changed.authorized_by(approval) is None
    assert _scheduled(say, authorized_by_plan=2).authorized_by(approval) is None
    assert _scheduled(say, authorized_by_plan=None).authorized_by(approval) is None
    undo = _scheduled(say).model_copy(update={"compensation_id": "undo-say"})
    assert undo.authorized_by(approval) is None
