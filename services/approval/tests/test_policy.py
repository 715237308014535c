"""The default policy and the judging of decisions, as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from helmline.approval._policy import judge_expiry, judge_step, judge_vote
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
    fold,
    new_event,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ANA = Actor(id="ana", roles=("approver",))


def _scheduled(tool: str, risk: str | None = None, **arguments: str) -> StepScheduled:
    return StepScheduled.model_validate(
        {"step_id": "s", "call_id": "s.1", "tool": tool, "arguments": arguments, "risk": risk}
    )


def _waiting_session() -> tuple[SessionState, Event]:
    started = new_event(
        SessionStarted(goal="g", requested_by=ANA),
        tenant="t",
        session_id="s1",
        source="test",
        at=NOW,
    )
    (request,) = judge_step(_scheduled("run_command", command="ls"), NOW)
    asked = started.derive(request.payload, source="test", at=NOW)
    return fold([started, asked]), started


def test_unknown_tools_are_denied() -> None:
    (decision,) = judge_step(_scheduled("format_disk"), NOW)
    assert isinstance(decision.payload, ToolCallDenied)
    assert "unknown tool 'format_disk'" in decision.payload.reason


def test_low_and_medium_risk_run_at_once() -> None:
    for tool in ("read_file", "write_file"):
        (decision,) = judge_step(_scheduled(tool, path="a"), NOW)
        assert isinstance(decision.payload, ToolCallAuthorized)


def test_a_plan_cannot_lower_a_tool_risk_but_can_raise_it() -> None:
    (lowered,) = judge_step(_scheduled("run_command", risk="low", command="ls"), NOW)
    assert isinstance(lowered.payload, ApprovalRequested)
    (raised,) = judge_step(_scheduled("read_file", risk="critical", path="a"), NOW)
    assert isinstance(raised.payload, ApprovalRequested)
    assert raised.payload.risk == "critical"


def test_high_risk_asks_a_person_for_ten_minutes() -> None:
    (decision,) = judge_step(_scheduled("run_command", command="ls"), NOW)
    request = decision.payload
    assert isinstance(request, ApprovalRequested)
    assert request.expires_at == NOW + timedelta(minutes=10)
    assert "approver" in request.approver_roles


def test_a_decision_by_someone_without_the_role_changes_nothing() -> None:
    state, _ = _waiting_session()
    vote = ApprovalDecisionSubmitted(
        request_id="s.1", decision="grant", decided_by=Actor(id="eve", roles=("viewer",))
    )
    assert judge_vote(state, vote) == []


def test_a_grant_authorises_the_call_with_modified_arguments() -> None:
    state, _ = _waiting_session()
    vote = ApprovalDecisionSubmitted(
        request_id="s.1", decision="grant", decided_by=ANA, modified_arguments={"command": "ls -l"}
    )
    granted, authorized = (d.payload for d in judge_vote(state, vote))
    assert isinstance(granted, ApprovalGranted)
    assert isinstance(authorized, ToolCallAuthorized)
    assert authorized.arguments == {"command": "ls -l"}
    assert authorized.approval_request_id == "s.1"


def test_a_denial_denies_the_call_with_who_and_why() -> None:
    state, _ = _waiting_session()
    vote = ApprovalDecisionSubmitted(
        request_id="s.1", decision="deny", decided_by=ANA, comment="too broad"
    )
    denied, call = (d.payload for d in judge_vote(state, vote))
    assert isinstance(denied, ApprovalDenied)
    assert isinstance(call, ToolCallDenied)
    assert call.reason == "denied by ana: too broad"


def test_a_request_expires_only_after_its_expiry() -> None:
    state, _ = _waiting_session()
    assert judge_expiry(state, "s.1", NOW + timedelta(minutes=9)) == []
    expired, call = (d.payload for d in judge_expiry(state, "s.1", NOW + timedelta(minutes=11)))
    assert isinstance(expired, ApprovalExpired)
    assert isinstance(call, ToolCallDenied)
