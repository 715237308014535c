"""Permission requests: a call that lacks a permission (its tool's, a network host) asks a
person for it instead of being denied, when the policy says who may grant it; a grant, for
the step or the session and until a time, is folded into the session and counted by the
policy. Judged as pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helmline.approval import Policy, PolicyFileError, parse_policy
from helmline.approval._policy import (
    Decision,
    judge_expiry,
    judge_release,
    judge_step,
    judge_vote,
    permission_request_id,
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
    GrantScope,
    Payload,
    PermissionRequested,
    PlanProposed,
    PlanStep,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
    ToolSpec,
    fold,
    new_event,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
PUSH = ToolSpec(
    name="git__git_push",
    description="Push a branch.",
    parameters={"type": "object", "properties": {"branch": {"type": "string"}}},
    risk="medium",
    executor="mcp",
    server="git",
    remote_name="git_push",
    required_permission="repo.write",
)
TOOLS = {**BUILTIN_TOOLS_BY_NAME, PUSH.name: PUSH}
READER = Actor(id="rita", roles=("operator",))
APPROVER = Actor(id="ana", roles=("approver",))
VIEWER = Actor(id="vic", roles=("viewer",))

POLICY_TEXT = b"""
permission_requests: {roles: [approver], expires_in: 5m, grant_expires_in: 30m, grant_at_most: 4h}
rules:
  - name: no-pushes-to-release
    tool: git__git_push
    arguments: {branch: {glob: 'release/**'}}
    effect: deny
  - name: status-page
    tool: run_command
    arguments: {command: {regex: '^curl '}}
    hosts: ['status.example.com', '*.internal']
    effect: allow
  - name: writes-in-src
    tool: write_file
    paths: ['src/**']
    effect: allow
  - name: deploys-ask
    tool: run_command
    arguments: {command: {regex: '^deploy '}}
    effect: require_approval
  - name: the-rest
    effect: allow
"""
POLICY = parse_policy(POLICY_TEXT, source="permissions.yaml", tools=TOOLS)
DENYING = parse_policy(
    POLICY_TEXT.replace(b"permission_requests:", b"# permission_requests:"),
    source="denying.yaml",
    tools=TOOLS,
)


def _call(
    tool: str = "run_command",
    hosts: Sequence[str] = (),
    step: str = "s",
    attempt: int = 1,
    **arguments: Any,
) -> StepScheduled:
    return StepScheduled.model_validate(
        {
            "step_id": step,
            "call_id": f"{step}.{attempt}",
            "attempt": attempt,
            "tool": tool,
            "arguments": arguments,
            "hosts": list(hosts),
        }
    )


def _judged(
    scheduled: StepScheduled,
    policy: Policy = POLICY,
    session: SessionState | None = None,
    now: datetime = NOW,
) -> Payload:
    (decision,) = judge_step(
        scheduled, policy, tenant="t", requester=READER, now=now, session=session
    )
    return decision.payload


def _asked(scheduled: StepScheduled, policy: Policy = POLICY) -> PermissionRequested:
    asked = _judged(scheduled, policy)
    assert isinstance(asked, PermissionRequested)
    return asked


def _session(*payloads: Payload, at: datetime = NOW) -> tuple[SessionState, list[Event]]:
    """The session of `payloads` (after its start and a plan of every scheduled step), each
    event stamped `at`."""
    steps = tuple(
        PlanStep(id=p.step_id, tool=p.tool, arguments=p.arguments, hosts=p.hosts)
        for p in payloads
        if isinstance(p, StepScheduled)
    )
    leading: list[Payload] = [SessionStarted(goal="g", requested_by=READER)]
    if steps:
        leading.append(PlanProposed(revision=1, steps=steps))
    events = [
        new_event(p, tenant="t", session_id="x", source="test").model_copy(update={"time": at})
        for p in (*leading, *payloads)
    ]
    return fold(events), events


def _vote(
    request_id: str,
    decision: str = "grant",
    by: Actor = APPROVER,
    scope: GrantScope | None = None,
    until: datetime | None = None,
    **extra: Any,
) -> ApprovalDecisionSubmitted:
    return ApprovalDecisionSubmitted.model_validate(
        {
            "request_id": request_id,
            "decision": decision,
            "decided_by": by,
            "grant_scope": scope,
            "grant_until": until,
            **extra,
        }
    )


def _payloads(decisions: Sequence[Decision]) -> list[Payload]:
    return [decision.payload for decision in decisions]


def _asked_and_granted(
    scheduled: StepScheduled, scope: GrantScope, until: datetime
) -> tuple[SessionState, list[Payload]]:
    asked = _judged(scheduled)
    assert isinstance(asked, PermissionRequested)
    state, _ = _session(scheduled, asked)
    vote = _vote(asked.request_id, scope=scope, until=until)
    decided = _payloads(judge_vote(fold([_event(vote)], state), vote, POLICY, NOW))
    state, _ = _session(scheduled, asked, vote, *decided)
    return state, decided


def _event(payload: Payload) -> Event:
    return new_event(payload, tenant="t", session_id="x", source="test").model_copy(
        update={"time": NOW}
    )


def test_a_host_its_rule_does_not_grant_is_asked_for_with_what_and_why() -> None:
    asked = _judged(_call(hosts=["api.example.com"], command="curl -s https://api.example.com"))
    assert isinstance(asked, PermissionRequested)
    assert asked.request_id == permission_request_id("s.1") == "permission-s.1"
    assert (asked.step_id, asked.call_id, asked.tool) == ("s", "s.1", "run_command")
    (need,) = asked.permissions
    assert (need.kind, need.name) == ("network", "api.example.com")
    assert need.reason == (
        "rule status-page grants only hosts matching 'status.example.com' or '*.internal'"
    )
    assert asked.rule == "status-page"
    assert asked.reason.startswith("the call needs network host api.example.com (rule status-page")
    assert (asked.approver_roles, asked.quorum) == (("approver",), 1)
    assert asked.expires_at == NOW + timedelta(minutes=5)
    assert asked.policy_hash == POLICY.hash


def test_hosts_the_rule_grants_run_with_a_network_and_calls_reaching_none_as_before() -> None:
    granted = _judged(_call(hosts=["status.example.com", "db.internal"], command="curl x"))
    assert isinstance(granted, ToolCallAuthorized)
    assert (granted.rule, granted.network) == ("status-page", True)
    offline = _judged(_call(command="curl x"))
    assert isinstance(offline, ToolCallAuthorized)
    assert offline.network is False
    # `the-rest` grants no host: a declared one is asked for, whatever the tool.
    asked = _judged(_call(tool="echo", hosts=["status.example.com"], message="hi"))
    assert isinstance(asked, PermissionRequested)
    assert asked.permissions[0].reason == "rule the-rest grants no network host"


def test_without_permission_requests_in_the_policy_a_missing_permission_is_denied() -> None:
    denied = _judged(_call(hosts=["api.example.com"], command="curl x"), DENYING)
    assert isinstance(denied, ToolCallDenied)
    assert denied.rule == "status-page"
    assert "api.example.com" in denied.reason
    push = _judged(_call(tool=PUSH.name, branch="main"), DENYING)
    assert isinstance(push, ToolCallDenied)
    assert push.rule == "required-permission"


def test_a_tool_permission_the_requester_lacks_is_asked_for_unless_the_rules_deny_the_call() -> (
    None
):
    asked = _judged(_call(tool=PUSH.name, hosts=["git.example.com"], branch="main"))
    assert isinstance(asked, PermissionRequested)
    assert [(n.kind, n.name) for n in asked.permissions] == [
        ("tool", "repo.write"),
        ("network", "git.example.com"),
    ]
    assert asked.rule == "required-permission"
    assert "which the requester rita (roles: operator) does not hold" in asked.reason
    # Asking would not help: the rules deny the call anyway.
    denied = _judged(_call(tool=PUSH.name, branch="release/1"))
    assert isinstance(denied, ToolCallDenied)
    assert denied.rule == "no-pushes-to-release"


def test_a_grant_for_the_session_lets_later_calls_run_until_it_ends() -> None:
    first = _call(hosts=["api.example.com"], command="curl a")
    until = NOW + timedelta(minutes=10)
    state, decided = _asked_and_granted(first, "session", until)
    granted, authorized = decided
    assert isinstance(granted, ApprovalGranted)
    assert (granted.grant_scope, granted.grant_until, granted.decided_by) == (
        "session",
        until,
        (APPROVER,),
    )
    assert isinstance(authorized, ToolCallAuthorized)
    assert (authorized.call_id, authorized.rule, authorized.network) == ("s.1", "status-page", True)
    assert state.approvals["permission-s.1"].grants("other", NOW)
    assert state.granted_permissions("other", NOW) == {("network", "api.example.com")}

    later = _call(step="t", hosts=["api.example.com"], command="curl b")
    runs = _judged(later, session=state, now=NOW + timedelta(minutes=9))
    assert isinstance(runs, ToolCallAuthorized)
    assert runs.network is True
    # An ended grant no longer applies: the call asks again.
    expired = _judged(later, session=state, now=until)
    assert isinstance(expired, PermissionRequested)
    assert state.granted_permissions("t", until) == frozenset()
    # Another host was never granted.
    other = _call(step="t", hosts=["other.example.com"], command="curl c")
    assert isinstance(_judged(other, session=state), PermissionRequested)


def test_a_grant_for_the_step_covers_its_retries_and_no_other_step() -> None:
    state, decided = _asked_and_granted(
        _call(hosts=["api.example.com"], command="curl a"), "step", NOW + timedelta(minutes=10)
    )
    assert isinstance(decided[-1], ToolCallAuthorized)
    retry = _call(attempt=2, hosts=["api.example.com"], command="curl a")
    assert isinstance(_judged(retry, session=state), ToolCallAuthorized)
    other = _call(step="t", hosts=["api.example.com"], command="curl a")
    assert isinstance(_judged(other, session=state), PermissionRequested)


def test_once_granted_the_rules_still_decide_the_call() -> None:
    # The rule asks a person to approve: the call waits again, as an approval of its own.
    deploy = _call(tool=PUSH.name, branch="main")
    state, decided = _asked_and_granted(deploy, "step", NOW + timedelta(minutes=10))
    assert isinstance(decided[-1], ToolCallAuthorized)
    assert decided[-1].rule == "the-rest"
    asks = _call(hosts=["deploy.example.com"], command="deploy prod")
    state, decided = _asked_and_granted(asks, "step", NOW + timedelta(minutes=10))
    requested = decided[-1]
    assert type(requested) is ApprovalRequested
    assert (requested.request_id, requested.rule) == ("s.1", "deploys-ask")
    assert state.pending_approvals[0].request_id == "s.1"


def test_a_denial_denies_the_call_as_the_policy_says() -> None:
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    asked = _asked(scheduled)
    state, _ = _session(scheduled, asked)
    vote = _vote(asked.request_id, "deny", comment="not that host")
    denied, call_denied = _payloads(judge_vote(state, vote, POLICY, NOW))
    assert isinstance(denied, ApprovalDenied)
    assert isinstance(call_denied, ToolCallDenied)
    assert call_denied.reason == "denied by ana: not that host"
    assert call_denied.approval_request_id == "permission-s.1"


def test_an_unanswered_request_expires_into_a_denial_of_the_call() -> None:
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    asked = _judged(scheduled)
    assert isinstance(asked, PermissionRequested)
    state, _ = _session(scheduled, asked)
    assert judge_expiry(state, asked.request_id, NOW, POLICY) == []
    expired, denied = _payloads(judge_expiry(state, asked.request_id, asked.expires_at, POLICY))
    assert isinstance(expired, ApprovalExpired)
    assert isinstance(denied, ToolCallDenied)
    assert denied.reason == "nobody decided before the permission request expired"


@pytest.mark.parametrize(
    ("vote", "problem"),
    [
        (_vote("nope"), "no approval request nope"),
        (_vote("permission-s.1", by=VIEWER),
         "vic holds none of the roles that may decide (approver)"),
        (_vote("permission-s.1", until=NOW), "is not in the future"),
        (_vote("permission-s.1", until=NOW + timedelta(hours=5)), "at most 4h"),
        (_vote("permission-s.1", similar_limit=2), "drop modified arguments and similar calls"),
        (_vote("permission-s.1", modified_arguments={"command": "curl b"}),
         "drop modified arguments and similar calls"),
    ],
)  # fmt: skip
def test_a_grant_that_cannot_stand_is_refused_with_why(
    vote: ApprovalDecisionSubmitted, problem: str
) -> None:
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    state, _ = _session(scheduled, _judged(scheduled))
    (refused,) = _payloads(judge_vote(state, vote, POLICY, NOW))
    assert isinstance(refused, ApprovalDecisionRefused)
    assert problem in refused.reason


def test_an_expired_request_and_a_grant_scope_on_an_approval_are_refused() -> None:
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    asked = _judged(scheduled)
    expired = ApprovalExpired(request_id="permission-s.1")
    state, _ = _session(scheduled, asked, expired)
    (refused,) = _payloads(judge_vote(state, _vote("permission-s.1"), POLICY, NOW))
    assert isinstance(refused, ApprovalDecisionRefused)
    assert refused.reason == "request permission-s.1 is already expired"

    deploy = _call(command="deploy prod")
    approval = _judged(deploy)
    assert type(approval) is ApprovalRequested
    state, _ = _session(deploy, approval)
    (refused,) = _payloads(judge_vote(state, _vote("s.1", scope="session"), POLICY, NOW))
    assert isinstance(refused, ApprovalDecisionRefused)
    assert "grant_scope and grant_until are for permission requests" in refused.reason


def test_without_a_time_the_grant_holds_for_the_policy_s_default() -> None:
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    state, _ = _session(scheduled, _judged(scheduled))
    granted, _authorized = _payloads(judge_vote(state, _vote("permission-s.1"), POLICY, NOW))
    assert isinstance(granted, ApprovalGranted)
    assert (granted.grant_scope, granted.grant_until) == ("step", NOW + timedelta(minutes=30))


def test_a_quorum_counts_grants_of_the_same_scope() -> None:
    text = POLICY_TEXT.replace(b"roles: [approver],", b"roles: [approver], quorum: 2,")
    policy = parse_policy(text, source="quorum.yaml", tools=TOOLS)
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    asked = _asked(scheduled, policy)
    ben = Actor(id="ben", roles=("approver",))
    first = _vote(asked.request_id, scope="session")
    state, _ = _session(scheduled, asked, first)
    (counted,) = _payloads(judge_vote(state, first, policy, NOW))
    assert isinstance(counted, ApprovalVoteCounted)
    other_scope = _vote(asked.request_id, by=ben, scope="step")
    state, _ = _session(scheduled, asked, first, counted, other_scope)
    (counted,) = _payloads(judge_vote(state, other_scope, policy, NOW))
    assert isinstance(counted, ApprovalVoteCounted)
    same = _vote(asked.request_id, by=ben, scope="session")
    state, _ = _session(scheduled, asked, first, counted, same)
    granted, authorized = _payloads(judge_vote(state, same, policy, NOW))
    assert isinstance(granted, ApprovalGranted)
    assert {actor.id for actor in granted.decided_by} == {"ana", "ben"}
    assert isinstance(authorized, ToolCallAuthorized)


def test_a_grant_while_paused_lets_the_call_be_judged_when_the_session_resumes() -> None:
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    asked = _judged(scheduled)
    vote = _vote("permission-s.1", scope="session")
    state, _ = _session(scheduled, asked, SessionPaused(), vote)
    (granted,) = _payloads(judge_vote(state, vote, POLICY, NOW))
    assert isinstance(granted, ApprovalGranted)
    state, _ = _session(scheduled, asked, SessionPaused(), vote, granted)
    (held,) = state.held_grants
    assert judge_release(state, held, POLICY, NOW) == []
    state, _ = _session(scheduled, asked, SessionPaused(), vote, granted, SessionResumed())
    (released,) = _payloads(judge_release(state, held, POLICY, NOW))
    assert isinstance(released, ToolCallAuthorized)
    assert released.network is True


def test_a_grant_the_policy_no_longer_honours_denies_the_call() -> None:
    scheduled = _call(hosts=["api.example.com"], command="curl a")
    state, _ = _session(scheduled, _judged(scheduled))
    (refused,) = _payloads(judge_vote(state, _vote("permission-s.1"), DENYING, NOW))
    assert isinstance(refused, ApprovalDecisionRefused)
    assert "lets nobody grant permissions on request" in refused.reason


def test_a_deny_rule_cannot_grant_hosts() -> None:
    text = b"rules: [{name: r, effect: deny, hosts: [a.example.com]}]"
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(text, source="p.yaml")
    assert "a deny rule grants nothing" in str(caught.value)


def test_a_default_grant_longer_than_the_limit_is_refused_at_load() -> None:
    text = b"permission_requests: {grant_expires_in: 2d, grant_at_most: 1d}"
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(text, source="p.yaml")
    assert "grant_expires_in must not be longer than grant_at_most" in str(caught.value)


def test_a_path_outside_the_rule_s_paths_is_asked_for_by_its_normal_form() -> None:
    inside = _judged(_call(tool="write_file", path="src/a.py", content="x"))
    assert isinstance(inside, ToolCallAuthorized)
    assert inside.rule == "writes-in-src"
    asked = _judged(_call(tool="write_file", path="src/../deploy/prod.env", content="x"))
    assert isinstance(asked, PermissionRequested)
    ((kind, name, reason),) = [(n.kind, n.name, n.reason) for n in asked.permissions]
    assert (kind, name) == ("path", "deploy/prod.env")
    assert reason == "rule writes-in-src grants only paths matching 'src/**'"
    assert asked.reason == f"the call needs path deploy/prod.env ({reason})"
    denied = _judged(_call(tool="write_file", path="deploy/prod.env", content="x"), DENYING)
    assert isinstance(denied, ToolCallDenied)
    assert (
        denied.reason
        == f"the call needs what its rule does not grant: path deploy/prod.env ({reason})"
    )


def test_a_path_granted_for_the_session_is_that_path_only() -> None:
    scheduled = _call(tool="write_file", path="deploy/prod.env", content="x")
    state, decided = _asked_and_granted(scheduled, "session", NOW + timedelta(minutes=10))
    assert isinstance(decided[-1], ToolCallAuthorized)
    again = _call(step="t", tool="write_file", path="deploy/./prod.env", content="y")
    assert isinstance(_judged(again, session=state), ToolCallAuthorized)
    other = _call(step="t", tool="write_file", path="deploy/other.env", content="y")
    assert isinstance(_judged(other, session=state), PermissionRequested)
