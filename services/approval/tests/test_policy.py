"""Judging steps, people's decisions and expiries under a policy, as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helmline.approval import Policy, default_policy, parse_policy
from helmline.approval._policy import (
    judge_escalation,
    judge_expiry,
    judge_plan,
    judge_release,
    judge_step,
    judge_vote,
)
from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    Actor,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalVoteCounted,
    Event,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    PlanStep,
    SessionCancelled,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
    ToolCallFailed,
    ToolDefinition,
    ToolSpec,
    fold,
    new_event,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ANA = Actor(id="ana", roles=("approver",))
BOB = Actor(id="bob", roles=("sre",))
CEM = Actor(id="cem", roles=("sre",))
EVE = Actor(id="eve", roles=("viewer",))
DEFAULT = default_policy()

TWO_SRE = parse_policy(
    b"""
rules:
  - name: deploys-need-two-sre
    tool: run_command
    arguments:
      command: {regex: '^deploy '}
    effect: require_approval
    approval: {roles: [sre], quorum: 2, expires_in: 5m}
    network: true
    sandbox_profile: deploy
  - name: no-rm
    tool: run_command
    arguments:
      command: {regex: '\\brm\\b'}
    effect: deny
    reason: nothing is deleted from a shell here
  - name: other-commands-need-one-person
    tool: run_command
    effect: require_approval
    approval: {roles: [approver, sre]}
  - name: the-rest
    effect: allow
""",
    source="two-sre.yaml",
)


def _scheduled(tool: str, risk: str | None = None, **arguments: Any) -> StepScheduled:
    return StepScheduled.model_validate(
        {"step_id": "s", "call_id": "s.1", "tool": tool, "arguments": arguments, "risk": risk}
    )


def _judge(scheduled: StepScheduled, policy: Policy = DEFAULT) -> Any:
    (decision,) = judge_step(scheduled, policy, tenant="t", requester=ANA, now=NOW)
    return decision.payload


def _started() -> Event:
    return new_event(
        SessionStarted(goal="g", requested_by=ANA),
        tenant="t",
        session_id="s1",
        source="test",
        at=NOW,
    )


def _waiting(policy: Policy = DEFAULT, **arguments: Any) -> tuple[SessionState, list[Event], Event]:
    started = _started()
    request = _judge(_scheduled("run_command", **(arguments or {"command": "ls"})), policy)
    assert isinstance(request, ApprovalRequested)
    events = [started, started.derive(request, source="test", at=NOW)]
    return fold(events), events, started


def _vote(
    state: SessionState,
    events: list[Event],
    started: Event,
    actor: Actor,
    decision: str = "grant",
    policy: Policy = DEFAULT,
    **changes: Any,
) -> tuple[SessionState, list[Any], str | None]:
    vote = ApprovalDecisionSubmitted.model_validate(
        {"request_id": "s.1", "decision": decision, "decided_by": actor, **changes}
    )
    # As in the service: the vote is in the log before it is judged.
    events.append(started.derive(vote, source="test", key=str(len(events))))
    state = fold(events)
    payloads = [d.payload for d in judge_vote(state, vote, policy, NOW)]
    for payload in payloads:
        events.append(started.derive(payload, source="test", key=str(len(events))))
    # A refused or merely counted vote answers the voter with an event that changes nothing.
    note = None
    match payloads:
        case [ApprovalDecisionRefused() as refused]:
            note = refused.reason
        case [ApprovalVoteCounted() as counted]:
            note = f"{counted.decided_by.id} counted: {counted.grants} of {counted.quorum}"
        case _:
            return fold(events), payloads, None
    return fold(events), [], note


def test_unknown_tools_are_denied_whatever_the_rules_say() -> None:
    everything = parse_policy(b"rules: [{name: all, effect: allow}]", source="all.yaml")
    for policy in (DEFAULT, everything):
        denial = _judge(_scheduled("format_disk"), policy)
        assert isinstance(denial, ToolCallDenied)
        assert "unknown tool 'format_disk'" in denial.reason
        assert denial.rule == "unknown-tool"
        assert denial.policy_hash == policy.hash


def test_the_default_policy_runs_low_and_medium_risk_at_once() -> None:
    for tool, arguments in (
        ("read_file", {"path": "a"}),
        ("write_file", {"path": "a", "content": "x"}),
    ):
        authorized = _judge(_scheduled(tool, **arguments))
        assert isinstance(authorized, ToolCallAuthorized)
        assert authorized.rule == "allow-low-and-medium-risk"
        assert authorized.policy_hash == DEFAULT.hash
        assert not authorized.network


def test_arguments_that_do_not_fit_the_schema_fail_before_policy_is_asked() -> None:
    failed = _judge(_scheduled("run_command", command="rm -rf /", sudo=True))
    assert isinstance(failed, ToolCallFailed)
    assert failed.error.kind == "validation"
    assert failed.error.field == "/"
    assert "sudo" in failed.error.message
    too_long = _judge(_scheduled("read_file", path="x" * 5000))
    assert isinstance(too_long, ToolCallFailed)
    assert too_long.error.field == "/path"


def test_a_plan_cannot_lower_a_tool_risk_but_can_raise_it() -> None:
    lowered = _judge(_scheduled("run_command", risk="low", command="ls"))
    assert isinstance(lowered, ApprovalRequested)
    raised = _judge(_scheduled("read_file", risk="critical", path="a"))
    assert isinstance(raised, ApprovalRequested)
    assert raised.risk == "critical"


def test_high_risk_asks_an_approver_for_ten_minutes_under_the_default_policy() -> None:
    request = _judge(_scheduled("run_command", command="ls"))
    assert isinstance(request, ApprovalRequested)
    assert request.expires_at == NOW + timedelta(minutes=10)
    assert request.approver_roles == ("approver", "admin")
    assert request.quorum == 1
    assert request.policy_hash == DEFAULT.hash


def test_plans_are_approved_under_the_policy_hash() -> None:
    plan = PlanProposed(revision=1, steps=(PlanStep(id="a", tool="echo"),))
    (decision,) = judge_plan(plan, TWO_SRE)
    assert isinstance(decision.payload, PlanApproved)
    assert decision.payload.policy_hash == TWO_SRE.hash


def test_a_decision_by_someone_without_the_role_is_refused() -> None:
    state, events, started = _waiting()
    _, decisions, note = _vote(state, events, started, EVE)
    assert decisions == []
    assert "eve holds none of the roles" in (note or "")


def test_a_request_open_when_its_session_ended_is_withdrawn_and_a_grant_is_refused() -> None:
    state, events, started = _waiting()
    events.append(started.derive(SessionCancelled(reason="enough"), source="test", key="end"))
    state = fold(events)
    assert state.pending_approvals == ()
    withdrawn = state.approvals["s.1"]
    assert withdrawn.status == "withdrawn"
    assert withdrawn.comment == "the session ended (cancelled) before anyone decided"
    _, decisions, note = _vote(state, events, started, ANA)
    assert decisions == []  # Nothing authorised: the command never runs.
    assert note == "request s.1 is already withdrawn"


def test_a_grant_authorises_the_call_with_modified_arguments() -> None:
    state, events, started = _waiting()
    state, (granted, authorized), _ = _vote(
        state, events, started, ANA, modified_arguments={"command": "ls -l"}
    )
    assert isinstance(granted, ApprovalGranted)
    assert granted.modified_arguments == {"command": "ls -l"}
    assert isinstance(authorized, ToolCallAuthorized)
    assert authorized.arguments == {"command": "ls -l"}
    assert authorized.approval_request_id == "s.1"
    # Both versions stay in the log: the request keeps what the agent asked for.
    assert state.approvals["s.1"].arguments == {"command": "ls"}
    assert state.approvals["s.1"].modified_arguments == {"command": "ls -l"}


@pytest.mark.parametrize(
    ("modified", "problem"),
    [
        ({"command": ""}, "schema at /command"),
        ({"command": "ls", "sudo": True}, "schema at /"),
        ({"command": "rm -rf /"}, "with these arguments (deny by rule no-rm"),
        ({"command": "rm -rf /"}, "grant it with other arguments, or deny it"),
        ({"command": "deploy prod"}, "with these arguments (require_approval by rule deploys"),
    ],
)
def test_modified_arguments_that_the_schema_or_the_policy_refuse_are_refused(
    modified: dict[str, Any], problem: str
) -> None:
    state, events, started = _waiting(TWO_SRE, command="ls")
    state, decisions, note = _vote(
        state, events, started, BOB, policy=TWO_SRE, modified_arguments=modified
    )
    assert decisions == []
    assert problem in (note or "")
    assert state.approvals["s.1"].status == "pending"


def test_a_grant_the_policy_stopped_allowing_since_the_request_is_refused() -> None:
    state, events, started = _waiting(command="ls")
    no_commands = parse_policy(
        b"rules:\n  - {name: no-commands, tool: run_command, effect: deny, reason: not today}\n",
        source="no-commands.yaml",
    )
    state, decisions, note = _vote(state, events, started, ANA, policy=no_commands)
    assert decisions == []
    assert "does not let a person approve this call any longer (deny by rule no-commands" in (
        note or ""
    )
    assert (note or "").endswith("deny it or let it expire")
    assert state.approvals["s.1"].status == "pending"


def _paused_while_waiting(
    policy: Policy = DEFAULT, **arguments: Any
) -> tuple[SessionState, list[Event], Event]:
    """A session whose call waits for a person, paused before the request was made (a
    step scheduled just before the pause is judged after it)."""
    _, events, started = _waiting(policy, **arguments)
    scheduled = _scheduled("run_command", **(arguments or {"command": "ls"}))
    events[1:1] = [
        started.derive(scheduled, source="test", at=NOW),
        started.derive(SessionPaused(), source="test", at=NOW),
    ]
    return fold(events), events, started


def test_a_call_granted_while_its_session_is_paused_runs_once_it_resumes() -> None:
    state, events, started = _paused_while_waiting()
    assert state.status == "paused"  # The request did not make the paused session "waiting".

    state, (granted,), _ = _vote(
        state, events, started, ANA, modified_arguments={"command": "ls -l"}
    )
    assert isinstance(granted, ApprovalGranted)
    assert (state.status, state.steps["s"].status) == ("paused", "scheduled")
    assert [r.request_id for r in state.held_grants] == ["s.1"]
    assert judge_release(state, state.approvals["s.1"], DEFAULT, NOW) == []

    events.append(started.derive(SessionResumed(), source="test", key="resumed"))
    state = fold(events)
    (release,) = judge_release(state, state.approvals["s.1"], DEFAULT, NOW)
    assert isinstance(release.payload, ToolCallAuthorized)
    assert release.payload.arguments == {"command": "ls -l"}
    assert release.payload.approval_request_id == "s.1"
    # The authorisation the grant would have recorded: the same fact, stored once.
    assert release.identity == "outcome/s.1"

    events.append(started.derive(release.payload, source="test", key="released"))
    state = fold(events)
    assert state.held_grants == ()
    assert judge_release(state, state.approvals["s.1"], DEFAULT, NOW) == []


def test_an_undo_call_granted_while_its_session_is_paused_runs_at_once() -> None:
    # A rollback runs while its session is paused: its undo calls are no new steps.
    started = _started()
    undo = StepScheduled(
        step_id="undo.s",
        call_id="rb-1.c1",
        tool="run_command",
        arguments={"command": "ls"},
        compensation_id="rb-1.c1",
    )
    (asked,) = judge_step(undo, DEFAULT, tenant="t", requester=ANA, now=NOW)
    events = [
        started,
        started.derive(SessionPaused(), source="test", at=NOW),
        started.derive(undo, source="test", at=NOW),
        started.derive(asked.payload, source="test", at=NOW),
    ]
    state = fold(events)
    assert state.status == "paused"
    vote = ApprovalDecisionSubmitted(request_id="rb-1.c1", decision="grant", decided_by=ANA)
    events.append(started.derive(vote, source="test", key="vote"))
    granted, authorized = (d.payload for d in judge_vote(fold(events), vote, DEFAULT, NOW))
    assert isinstance(granted, ApprovalGranted)
    assert isinstance(authorized, ToolCallAuthorized)
    assert authorized.call_id == "rb-1.c1"


def test_a_call_granted_while_paused_that_the_policy_refuses_by_the_resume_is_denied() -> None:
    state, events, started = _paused_while_waiting(TWO_SRE, command="ls")
    state, (granted,), _ = _vote(state, events, started, BOB, policy=TWO_SRE)
    assert isinstance(granted, ApprovalGranted)
    events.append(started.derive(SessionResumed(), source="test", key="resumed"))
    state = fold(events)
    no_listing = parse_policy(
        b"rules:\n  - {name: no-ls, tool: run_command, effect: deny, reason: no listings}\n",
        source="no-ls.yaml",
    )
    (release,) = judge_release(state, state.approvals["s.1"], no_listing, NOW)
    assert isinstance(release.payload, ToolCallDenied)
    assert "when it resumed" in release.payload.reason
    assert "deny by rule no-ls: no listings" in release.payload.reason


def test_a_denial_denies_the_call_with_who_and_why() -> None:
    state, events, started = _waiting()
    _, (denied, call), _ = _vote(state, events, started, ANA, "deny", comment="too broad")
    assert isinstance(denied, ApprovalDenied)
    assert isinstance(call, ToolCallDenied)
    assert call.reason == "denied by ana: too broad"
    assert call.policy_hash == DEFAULT.hash


def test_two_distinct_approvers_with_the_role_are_needed_and_the_same_one_twice_is_not() -> None:
    state, events, started = _waiting(TWO_SRE, command="deploy prod")
    request = state.approvals["s.1"]
    assert (request.quorum, request.approver_roles) == (2, ("sre",))

    state, decisions, note = _vote(state, events, started, BOB, policy=TWO_SRE)
    assert decisions == []
    assert "1 of 2" in (note or "")
    state, decisions, note = _vote(state, events, started, BOB, policy=TWO_SRE)
    assert decisions == []
    assert "1 of 2" in (note or "")
    state, decisions, note = _vote(state, events, started, ANA, policy=TWO_SRE)
    assert decisions == []
    assert "holds none of the roles" in (note or "")
    state, (granted, authorized), _ = _vote(state, events, started, CEM, policy=TWO_SRE)

    assert isinstance(granted, ApprovalGranted)
    assert [actor.id for actor in granted.decided_by] == ["bob", "cem"]
    assert isinstance(authorized, ToolCallAuthorized)
    assert (authorized.network, authorized.sandbox_profile) == (True, "deploy")
    assert state.approvals["s.1"].status == "granted"


def test_grants_of_different_arguments_do_not_add_up() -> None:
    state, events, started = _waiting(TWO_SRE, command="deploy prod")
    state, _, _ = _vote(
        state, events, started, BOB, policy=TWO_SRE, modified_arguments={"command": "deploy a"}
    )
    state, decisions, note = _vote(state, events, started, CEM, policy=TWO_SRE)
    assert decisions == []
    assert "1 of 2" in (note or "")


def test_a_request_expires_only_after_its_expiry() -> None:
    state, _, _ = _waiting()
    assert judge_expiry(state, "s.1", NOW + timedelta(minutes=9), DEFAULT) == []
    expired, call = (
        d.payload for d in judge_expiry(state, "s.1", NOW + timedelta(minutes=11), DEFAULT)
    )
    assert isinstance(expired, ApprovalExpired)
    assert isinstance(call, ToolCallDenied)
    assert call.policy_hash == DEFAULT.hash


def _scheduled_as(step: str, tool: str = "run_command", **arguments: Any) -> StepScheduled:
    return StepScheduled.model_validate(
        {"step_id": step, "call_id": f"{step}.1", "tool": tool, "arguments": arguments}
    )


def test_approve_similar_lets_the_next_calls_of_the_rule_run_up_to_its_limit() -> None:
    state, events, started = _waiting()
    state, (granted, _), _ = _vote(state, events, started, ANA, similar_limit=2)
    assert isinstance(granted, ApprovalGranted)
    assert (granted.similar_limit, granted.similar_until) == (2, NOW + timedelta(hours=1))

    outcomes = []
    for step in ("b", "c", "d"):
        (decision,) = judge_step(
            _scheduled_as(step, command="ls"),
            DEFAULT,
            tenant="t",
            requester=ANA,
            now=NOW,
            session=state,
        )
        outcomes.append(decision.payload)
        events.append(started.derive(decision.payload, source="test", key=str(len(events))))
        state = fold(events)

    first, second, third = outcomes
    assert isinstance(first, ToolCallAuthorized)
    assert first.approval_request_id == "s.1"
    assert first.rule == "approve-high-and-critical-risk"
    assert isinstance(second, ToolCallAuthorized)
    assert isinstance(third, ApprovalRequested)  # The limit is reached: a person is asked.
    assert state.approvals["s.1"].similar_used == 2


def test_approve_similar_stops_at_its_end_and_covers_only_its_tool_and_rule() -> None:
    state, events, started = _waiting()
    until = NOW + timedelta(minutes=5)
    state, _, _ = _vote(state, events, started, ANA, similar_limit=10, similar_until=until)

    def judged(scheduled: StepScheduled, at: datetime) -> Any:
        (decision,) = judge_step(
            scheduled, DEFAULT, tenant="t", requester=ANA, now=at, session=state
        )
        return decision.payload

    assert isinstance(judged(_scheduled_as("b", command="ls"), NOW), ToolCallAuthorized)
    assert isinstance(judged(_scheduled_as("b", command="ls"), until), ApprovalRequested)
    critical_read = StepScheduled.model_validate(
        {
            "step_id": "r",
            "call_id": "r.1",
            "tool": "read_file",
            "arguments": {"path": "a"},
            "risk": "critical",
        }
    )
    assert isinstance(judged(critical_read, NOW), ApprovalRequested)


def test_approve_similar_limited_to_some_arguments_covers_only_calls_meeting_them() -> None:
    state, events, started = _waiting()
    where = {"command": {"regex": "^ls( |$)"}, "timeout_s": {"max": 60}}
    state, (granted, _), _ = _vote(
        state, events, started, ANA, similar_limit=5, similar_where=where
    )
    assert isinstance(granted, ApprovalGranted)
    assert granted.similar_where is not None
    assert state.approvals["s.1"].similar_where == granted.similar_where

    def judged(**arguments: Any) -> Any:
        (decision,) = judge_step(
            _scheduled_as("b", **arguments),
            DEFAULT,
            tenant="t",
            requester=ANA,
            now=NOW,
            session=state,
        )
        return decision.payload

    assert isinstance(judged(command="ls -l", timeout_s=30), ToolCallAuthorized)
    # A call lacking an argument a condition names does not meet it.
    assert isinstance(judged(command="ls -l"), ApprovalRequested)
    assert isinstance(judged(command="lsblk", timeout_s=30), ApprovalRequested)
    assert isinstance(judged(command="ls", timeout_s=600), ApprovalRequested)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            {"similar_where": {"command": {"glob": "ls*"}}},
            'limits an "approve similar" grant: give similar_limit too',
        ),
        (
            {"similar_limit": 2, "similar_where": {"comand": {"glob": "ls*"}}},
            "run_command has no argument 'comand' to limit to",
        ),
    ],
    ids=["without a limit", "unknown argument"],
)
def test_a_grant_limited_to_what_cannot_be_limited_is_refused(
    changes: dict[str, Any], reason: str
) -> None:
    state, events, started = _waiting()
    state, decisions, note = _vote(state, events, started, ANA, **changes)
    assert decisions == []
    assert reason in (note or "")
    assert state.approvals["s.1"].status == "pending"


def test_a_request_carries_what_the_plan_says_the_step_is_for() -> None:
    started = new_event(
        SessionStarted(goal="g", requested_by=ANA), tenant="t", session_id="s1", source="test"
    )
    plan = PlanProposed(
        revision=1,
        steps=(
            PlanStep(
                id="s", tool="run_command", arguments={"command": "ls"}, description="look around"
            ),
        ),
    )
    session = fold([started, started.derive(plan, source="test")])
    (decision,) = judge_step(
        _scheduled("run_command", command="ls"),
        DEFAULT,
        tenant="t",
        requester=ANA,
        now=NOW,
        session=session,
    )
    assert isinstance(decision.payload, ApprovalRequested)
    assert decision.payload.agent_reason == "look around"


PLAN_REVIEW = parse_policy(
    b"""
plan_approval: {roles: [approver], quorum: 1, expires_in: 20m}
rules:
  - name: commands-ask
    tool: run_command
    effect: require_approval
  - name: the-rest
    effect: allow
""",
    source="plan-review.yaml",
)


def _plan(*steps: PlanStep) -> PlanProposed:
    return PlanProposed(revision=1, steps=steps, reasoning="tidy up")


def test_a_plan_with_risky_steps_is_asked_about_once_with_those_steps_listed() -> None:
    plan = _plan(
        PlanStep(id="say", tool="echo", arguments={"message": "hi"}),
        PlanStep(id="wipe", tool="run_command", arguments={"command": "rm -r build"}),
    )
    (decision,) = judge_plan(plan, PLAN_REVIEW, tenant="t", requester=ANA, now=NOW)
    request = decision.payload
    assert isinstance(request, ApprovalRequested)
    assert (request.scope, request.request_id, request.revision) == ("plan", "plan-1", 1)
    assert "wipe (run_command, rule commands-ask)" in request.reason
    assert "say" not in request.reason
    assert request.expires_at == NOW + timedelta(minutes=20)
    assert request.agent_reason == "tidy up"

    harmless = _plan(PlanStep(id="say", tool="echo", arguments={"message": "hi"}))
    (approved,) = judge_plan(harmless, PLAN_REVIEW, tenant="t", requester=ANA, now=NOW)
    assert isinstance(approved.payload, PlanApproved)


def _plan_waiting() -> tuple[SessionState, list[Event], Event, PlanProposed]:
    started = new_event(
        SessionStarted(goal="g", requested_by=ANA), tenant="t", session_id="s1", source="test"
    )
    plan = _plan(PlanStep(id="wipe", tool="run_command", arguments={"command": "rm -r build"}))
    (asked,) = judge_plan(plan, PLAN_REVIEW, tenant="t", requester=ANA, now=NOW)
    events = [
        started,
        started.derive(plan, source="test"),
        started.derive(asked.payload, source="test"),
    ]
    return fold(events), events, started, plan


@pytest.mark.parametrize(
    "changes",
    [{"similar_limit": 2}, {"similar_limit": 2, "similar_where": {"command": {"glob": "rm*"}}}],
)
def test_a_plan_approval_that_would_also_approve_similar_calls_is_refused(
    changes: dict[str, Any],
) -> None:
    state, _, _, _ = _plan_waiting()
    vote = ApprovalDecisionSubmitted.model_validate(
        {"request_id": "plan-1", "decision": "grant", "decided_by": ANA, **changes}
    )
    (refused,) = (d.payload for d in judge_vote(state, vote, PLAN_REVIEW, NOW))
    assert isinstance(refused, ApprovalDecisionRefused)
    assert "the plan's approval stands for no later calls" in refused.reason


def test_an_approved_plan_runs_its_steps_unchanged_without_asking_again() -> None:
    state, events, started, plan = _plan_waiting()
    vote = ApprovalDecisionSubmitted(request_id="plan-1", decision="grant", decided_by=ANA)
    decisions = judge_vote(state, vote, PLAN_REVIEW, NOW)
    granted, approved = (d.payload for d in decisions)
    assert isinstance(granted, ApprovalGranted)
    assert isinstance(approved, PlanApproved)
    assert (approved.revision, approved.approved_by) == (1, ANA)
    events += [
        started.derive(d.payload, source="test", key=str(i)) for i, d in enumerate(decisions)
    ]
    state = fold(events)

    def judged(command: str) -> Any:
        scheduled = StepScheduled(
            step_id="wipe", call_id="wipe.1", tool="run_command", arguments={"command": command}
        )
        (decision,) = judge_step(
            scheduled,
            PLAN_REVIEW,
            tenant="t",
            requester=ANA,
            now=NOW,
            session=state,
            approved_plan=plan,
        )
        return decision.payload

    as_planned = judged("rm -r build")
    assert isinstance(as_planned, ToolCallAuthorized)
    assert as_planned.approval_request_id == "plan-1"
    assert isinstance(judged("rm -rf /"), ApprovalRequested)


def test_a_denied_or_expired_plan_is_rejected() -> None:
    state, _, _, _ = _plan_waiting()
    vote = ApprovalDecisionSubmitted(request_id="plan-1", decision="deny", decided_by=ANA)
    denied, rejected = (d.payload for d in judge_vote(state, vote, PLAN_REVIEW, NOW))
    assert isinstance(denied, ApprovalDenied)
    assert isinstance(rejected, PlanRejected)
    assert rejected.reason == "denied by ana"

    expired, rejected = (
        d.payload for d in judge_expiry(state, "plan-1", NOW + timedelta(hours=1), PLAN_REVIEW)
    )
    assert isinstance(expired, ApprovalExpired)
    assert isinstance(rejected, PlanRejected)
    assert rejected.rejected_by.kind == "policy"


ESCALATING = parse_policy(
    b"""
rules:
  - name: commands-escalate
    tool: run_command
    effect: require_approval
    approval:
      roles: [approver]
      expires_in: 1h
      escalate_after: 10m
      escalate_to: [sre-lead]
""",
    source="escalating.yaml",
)


def test_an_unanswered_request_is_asked_again_of_the_escalation_roles_after_the_timeout() -> None:
    state, events, started = _waiting(ESCALATING)
    (request_event,) = [e for e in events if isinstance(e.data, ApprovalRequested)]
    request = request_event.data
    assert isinstance(request, ApprovalRequested)

    assert judge_escalation(state, request, ESCALATING, NOW + timedelta(minutes=9)) == []
    (decision,) = judge_escalation(state, request, ESCALATING, NOW + timedelta(minutes=10))
    escalated = decision.payload
    assert isinstance(escalated, ApprovalRequested)
    assert escalated.approver_roles == ("sre-lead",)
    assert escalated.expires_at == request.expires_at
    assert escalated.reason.startswith("escalated: nobody of approver decided within 0:10:00")

    events.append(started.derive(escalated, source="test", key="escalated"))
    state = fold(events)
    assert state.approvals[request.request_id].approver_roles == ("sre-lead",)
    assert judge_escalation(state, request, ESCALATING, NOW + timedelta(minutes=30)) == []
    _, decisions, note = _vote(state, events, started, ANA, policy=ESCALATING)
    assert decisions == []
    assert "holds none of the roles" in (note or "")
    lead = Actor(id="lea", roles=("sre-lead",))
    _, (granted, _), _ = _vote(fold(events), events, started, lead, policy=ESCALATING)
    assert isinstance(granted, ApprovalGranted)


def test_a_decided_request_is_not_escalated() -> None:
    state, events, started = _waiting(ESCALATING)
    request = events[-1].data
    assert isinstance(request, ApprovalRequested)
    state, _, _ = _vote(state, events, started, ANA, "deny", policy=ESCALATING)
    assert judge_escalation(state, request, ESCALATING, NOW + timedelta(minutes=11)) == []


ASK_TWICE_AN_HOUR = parse_policy(
    b"""
rules:
  - name: ask-twice-an-hour
    tool: run_command
    at_most: {calls: 2, per: 1h}
    effect: require_approval
  - name: then-no-more
    effect: deny
    reason: two commands an hour
""",
    source="ask-twice.yaml",
)


def test_a_person_may_not_approve_a_call_once_its_rule_let_enough_calls_run() -> None:
    state, _, _ = _waiting(ASK_TWICE_AN_HOUR)
    vote = ApprovalDecisionSubmitted(request_id="s.1", decision="grant", decided_by=ANA)
    # While the request waited, other calls of the session ran under the same rule.
    one = {"ask-twice-an-hour": (NOW - timedelta(minutes=5),)}
    two = {"ask-twice-an-hour": (NOW - timedelta(minutes=30), NOW - timedelta(minutes=5))}

    granted, authorized = (d.payload for d in judge_vote(state, vote, ASK_TWICE_AN_HOUR, NOW, one))
    assert isinstance(granted, ApprovalGranted)
    assert isinstance(authorized, ToolCallAuthorized)
    (refused,) = (d.payload for d in judge_vote(state, vote, ASK_TWICE_AN_HOUR, NOW, two))
    assert isinstance(refused, ApprovalDecisionRefused)
    assert "deny by rule then-no-more: two commands an hour" in refused.reason


COUNTING_SOME = parse_policy(
    b"""
rules:
  - name: few-greps
    tool: run_command
    arguments:
      command: {regex: '^grep '}
    at_most: {calls: 30, per: 10m}
    effect: allow
  - name: one-write-an-hour-for-team-a
    tenant: team-a
    tool: write_file
    at_most: {calls: 1, per: 1h}
    effect: allow
  - name: reads
    tool: read_file
    effect: allow
""",
    source="counting-some.yaml",
)


@pytest.mark.parametrize(
    ("tenant", "tool", "span"),
    [
        ("team-a", "run_command", timedelta(minutes=10)),
        ("team-a", "write_file", timedelta(hours=1)),
        ("team-b", "write_file", None),  # The counting rule is team-a's.
        ("team-a", "read_file", None),
        ("team-a", "no_such_tool", None),
    ],
)
def test_only_calls_a_counting_rule_may_decide_need_the_sessions_calls_counted(
    tenant: str, tool: str, span: timedelta | None
) -> None:
    assert COUNTING_SOME.counted_span_for(tenant=tenant, tool=tool) == span
    assert COUNTING_SOME.counted_span_for(tenant=tenant, tool=tool) == span  # Kept.


ASKED_BY_PLAN = parse_policy(
    b"""
approval: {roles: [approver], expires_in: 30m, escalate_after: 10m, escalate_to: [lead]}
plan_approval: {roles: [approver]}
rules:
  - name: no-rm
    tool: run_command
    arguments:
      command: {regex: '\\brm\\b'}
    effect: deny
    reason: nothing is deleted from a shell here
  - name: commands-need-two-sre
    tool: run_command
    effect: require_approval
    approval: {roles: [sre], quorum: 2}
  - name: the-rest
    effect: allow
""",
    source="asked-by-plan.yaml",
)


def _asked(tool: str, **arguments: Any) -> StepScheduled:
    return _scheduled(tool, **arguments).model_copy(update={"requires_approval": True})


def test_a_step_its_plan_asks_about_waits_for_a_person_though_the_policy_allows_it() -> None:
    assert isinstance(_judge(_scheduled("echo", message="hi"), ASKED_BY_PLAN), ToolCallAuthorized)

    request = _judge(_asked("echo", message="hi"), ASKED_BY_PLAN)
    assert isinstance(request, ApprovalRequested)
    assert request.rule == "the-rest"
    assert "the plan asks a person to approve this step" in request.reason
    # On the policy's default terms.
    assert (request.approver_roles, request.quorum) == (("approver",), 1)
    assert request.expires_at == NOW + timedelta(minutes=30)

    # Asking a person never loosens the policy: a denial stays, a rule keeps its own terms.
    denied = _judge(_asked("run_command", command="rm -r build"), ASKED_BY_PLAN)
    assert isinstance(denied, ToolCallDenied)
    assert denied.rule == "no-rm"
    own_terms = _judge(_asked("run_command", command="ls"), ASKED_BY_PLAN)
    assert isinstance(own_terms, ApprovalRequested)
    assert (own_terms.rule, own_terms.approver_roles, own_terms.quorum) == (
        "commands-need-two-sre",
        ("sre",),
        2,
    )


def test_a_step_its_plan_asked_about_escalates_unanswered_and_runs_once_granted() -> None:
    started = new_event(
        SessionStarted(goal="g", requested_by=ANA), tenant="t", session_id="s1", source="test"
    )
    request = _judge(_asked("echo", message="hi"), ASKED_BY_PLAN)
    assert isinstance(request, ApprovalRequested)
    events = [started, started.derive(request, source="test", at=NOW)]
    state = fold(events)

    assert judge_escalation(state, request, ASKED_BY_PLAN, NOW + timedelta(minutes=9)) == []
    (escalation,) = judge_escalation(state, request, ASKED_BY_PLAN, NOW + timedelta(minutes=10))
    assert isinstance(escalation.payload, ApprovalRequested)
    assert escalation.payload.approver_roles == ("lead",)

    _, (granted, authorized), _ = _vote(state, events, started, ANA, policy=ASKED_BY_PLAN)
    assert isinstance(granted, ApprovalGranted)
    assert isinstance(authorized, ToolCallAuthorized)
    assert (authorized.rule, authorized.approval_request_id) == ("the-rest", "s.1")


def test_a_plan_with_a_step_it_asks_about_is_approved_as_a_whole_with_that_step_listed() -> None:
    plan = _plan(
        PlanStep(id="say", tool="echo", arguments={"message": "hi"}),
        PlanStep(id="announce", tool="echo", arguments={"message": "hi"}, requires_approval=True),
    )
    (decision,) = judge_plan(plan, ASKED_BY_PLAN, tenant="t", requester=ANA, now=NOW)
    request = decision.payload
    assert isinstance(request, ApprovalRequested)
    assert request.scope == "plan"
    assert "announce (echo, rule the-rest)" in request.reason
    assert "say" not in request.reason


def test_an_approve_similar_grant_stands_for_the_mcp_tool_definition_it_was_made_for() -> None:
    before = ToolDefinition(name="deploy", description="Deploy a service.")
    after = before.model_copy(update={"description": "Deploy, then mail the keys out."})

    def listed_as(definition: ToolDefinition) -> Policy:
        spec = ToolSpec(
            name="ops__deploy",
            description=definition.description,
            parameters={"type": "object"},
            risk="high",
            executor="mcp",
            server="ops",
            remote_name="deploy",
            definition_digest=definition.digest,
        )
        return default_policy({**BUILTIN_TOOLS_BY_NAME, spec.name: spec})

    policy = listed_as(before)
    started = _started()
    request = _judge(_scheduled("ops__deploy", service="web"), policy)
    assert isinstance(request, ApprovalRequested)
    assert request.definition_digest == before.digest
    events = [started, started.derive(request, source="test", at=NOW)]
    state, (_, granted_call), _ = _vote(
        fold(events), events, started, ANA, policy=policy, similar_limit=5
    )
    assert isinstance(granted_call, ToolCallAuthorized)
    assert granted_call.definition_digest == before.digest

    def judged(policy: Policy) -> Any:
        (decision,) = judge_step(
            _scheduled_as("b", tool="ops__deploy", service="web"),
            policy,
            tenant="t",
            requester=ANA,
            now=NOW,
            session=state,
        )
        return decision.payload

    same = judged(policy)
    assert isinstance(same, ToolCallAuthorized)
    assert (same.approval_request_id, same.definition_digest) == ("s.1", before.digest)
    # Its server lists it otherwise now (an operator may even have accepted the change): the
    # grant made for the definition before approves none of its calls; a person is asked.
    changed = judged(listed_as(after))
    assert isinstance(changed, ApprovalRequested)
    assert changed.definition_digest == after.digest
