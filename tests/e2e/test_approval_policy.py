"""A policy file in force across the services as processes: quorum, modified arguments, and
requests that expire while the approval service is down."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from helmline.approval import policy_hash
from helmline.contracts import (
    Actor,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalVoteCounted,
    Event,
    PlanStep,
    Playbook,
    SessionStarted,
    SessionState,
    ToolCallDenied,
    authorizations,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, eventually

POLICY = """
rules:
  - name: touch-expires-fast
    tool: run_command
    arguments:
      command: {regex: '^touch '}
    effect: require_approval
    approval: {roles: [approver], expires_in: 3s}
  - name: echo-needs-two-sre
    tool: run_command
    arguments:
      command: {regex: '^echo '}
    effect: require_approval
    approval: {roles: [sre], quorum: 2, expires_in: 10m}
  - name: listing-asks
    tool: run_command
    arguments:
      command: {regex: '^ls'}
    effect: require_approval
    approval: {roles: [approver]}
  - name: the-rest
    effect: allow
"""
SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
REQUESTER = Actor(id="ana", roles=("operator",))
BOB = Actor(id="bob", roles=("sre",))
CEM = Actor(id="cem", roles=("sre",))
EVE = Actor(id="eve", roles=("viewer",))
Helmline = Callable[..., Awaitable[tuple[int, str, str]]]


class PolicyStack:
    """The services, with the approval service under the test's policy file."""

    def __init__(self, processes: ServiceProcesses, policy: Path) -> None:
        self.processes = processes
        self.policy = policy

    def start(self, name: str) -> None:
        with pytest.MonkeyPatch.context() as patch:
            if name == "approval":
                patch.setenv("HELMLINE_POLICY", str(self.policy))
            self.processes.start(name)

    @asynccontextmanager
    async def policy_in_force(self, text: str) -> AsyncIterator[None]:
        """The approval service decides by `text` in the block, by the test's policy after."""
        original = self.policy.read_text()
        await self.edit_policy(text)
        try:
            yield
        finally:
            await self.edit_policy(original)

    async def edit_policy(self, text: str) -> None:
        """Write the policy file and wait until the approval service has reloaded it."""
        log = self.processes.data_dir / "approval.log"
        in_force = policy_hash(text.encode())
        loaded_before = log.read_text().count(in_force)
        self.policy.write_text(text)
        await eventually(
            lambda: log.read_text().count(in_force) > loaded_before,
            timeout_s=10,
            what="the reload",
        )


@pytest.fixture(scope="module")
def stack(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyStack]:
    folder = tmp_path_factory.mktemp("policy-stack")
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    running = PolicyStack(ServiceProcesses(nats_url, folder), policy)
    try:
        for name in SERVICES:
            running.start(name)
        yield running
    finally:
        running.processes.stop_all()


async def _start(store: EventStore, tenant: str, command: str) -> tuple[str, Event]:
    playbook = Playbook(
        goal="one command",
        steps=(PlanStep(id="cmd", tool="run_command", arguments={"command": command}),),
    )
    session_id = uuid.uuid4().hex
    started = new_event(
        SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=REQUESTER),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    await store.append(started)
    return session_id, started


async def _until(store: EventStore, tenant: str, session_id: str, *statuses: str) -> SessionState:
    async def reached() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.status in statuses else None

    state: SessionState = await eventually(
        reached, timeout_s=30, what=f"session {' or '.join(statuses)}"
    )
    return state


async def _vote(store: EventStore, started: Event, actor: Actor, **changes: Any) -> None:
    vote = ApprovalDecisionSubmitted.model_validate(
        {"request_id": "cmd.1", "decision": "grant", "decided_by": actor, **changes}
    )
    await store.append(started.derive(vote, source="test", key=uuid.uuid4().hex))


async def test_a_request_that_expires_while_the_approval_service_is_down_is_denied_at_restart(
    stack: PolicyStack, store: EventStore, tenant: str
) -> None:
    session_id, _ = await _start(store, tenant, "touch never")
    waiting = await _until(store, tenant, session_id, "waiting")
    (request,) = waiting.pending_approvals
    assert request.rule == "touch-expires-fast"

    stack.processes.kill("approval")
    await eventually(
        lambda: datetime.now(UTC) > request.expires_at, timeout_s=10, what="the expiry"
    )
    # Nobody else expires requests: the session still waits while the service is down.
    assert (await store.load(tenant, session_id)).state.status == "waiting"
    stack.start("approval")

    state = await _until(store, tenant, session_id, "failed", "completed")
    assert state.status == "failed"  # The plan's default: a denied step fails the session.
    assert state.approvals[request.request_id].status == "expired"
    assert state.steps["cmd"].status == "denied"
    assert "expired" in (state.steps["cmd"].reason or "")


async def test_a_rule_holds_only_within_its_time_window_by_the_service_s_clock(
    stack: PolicyStack, store: EventStore, tenant: str
) -> None:
    now = datetime.now(UTC)

    def hours(start: timedelta, end: timedelta) -> str:
        # Past midnight is fine: a window ending before it starts runs into the next day.
        return f"{now + start:%H:%M}-{now + end:%H:%M}"

    windows = (
        "rules:\n"
        "  - name: open-now\n    arguments: {command: {regex: '^echo open'}}\n"
        f"    during: {{hours: '{hours(timedelta(hours=-1), timedelta(hours=1))}'}}\n"
        "    effect: allow\n"
        "  - name: open-later\n    arguments: {command: {regex: '^echo later'}}\n"
        f"    during: {{hours: '{hours(timedelta(hours=1), timedelta(hours=2))}'}}\n"
        "    effect: allow\n"
        "  - name: the-rest\n    effect: deny\n    reason: outside its window\n"
    )
    async with stack.policy_in_force(windows):
        opened, _ = await _start(store, tenant, "echo open")
        later, _ = await _start(store, tenant, "echo later")
        ran = await _until(store, tenant, opened, "completed", "failed")
        refused = await _until(store, tenant, later, "completed", "failed")

    assert ran.status == "completed", ran.outcome
    assert refused.status == "failed"
    events = [stored.event.data for stored in await store.read_all(tenant, later)]
    (denied,) = [e for e in events if isinstance(e, ToolCallDenied)]
    assert (denied.rule, denied.reason) == ("the-rest", "outside its window")


async def test_a_rule_lets_only_so_many_calls_of_a_session_run_and_explain_counts_them(
    stack: PolicyStack, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    limited = (
        "rules:\n"
        "  - name: two-echoes-an-hour\n    arguments: {command: {regex: '^echo '}}\n"
        "    at_most: {calls: 2, per: 1h}\n    effect: allow\n"
        "  - name: the-rest\n    effect: deny\n    reason: enough echoes\n"
    )
    playbook = Playbook(
        goal="three echoes",
        steps=tuple(
            PlanStep(
                id=f"s{index}",
                tool="run_command",
                arguments={"command": f"echo {index}"},
                depends_on=(f"s{index - 1}",) if index else (),
            )
            for index in range(3)
        ),
    )
    sessions = [uuid.uuid4().hex for _ in range(2)]
    async with stack.policy_in_force(limited):
        for session_id in sessions:  # One after the other: each counts only its own.
            started = SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=REQUESTER)
            await store.append(
                new_event(started, tenant=tenant, session_id=session_id, source="test")
            )
            state = await _until(store, tenant, session_id, "completed", "failed")
            statuses = [state.steps[f"s{index}"].status for index in range(3)]
            assert statuses == ["succeeded", "succeeded", "denied"], state.outcome
        policy = stack.processes.data_dir / "limited.yaml"
        policy.write_text(limited)
        code, out, err = await helmline(
            "policy", "explain", sessions[0], "s2", "--tenant", tenant, "--policy", str(policy)
        )
    assert code == 0, err
    assert (
        "two-echoes-an-hour: skipped, not: fewer than 2 calls of the session ran under this "
        "rule in the last 1h"
    ) in out
    code, out, err = await helmline(
        "policy", "explain", sessions[0], "s1", "--tenant", tenant, "--policy", str(policy)
    )
    assert code == 0, err
    assert "two-echoes-an-hour: MATCHED" in out  # Counting only the calls before it.


async def test_two_distinct_sre_must_grant_and_the_tool_receives_the_modified_arguments(
    stack: PolicyStack, store: EventStore, tenant: str
) -> None:
    session_id, started = await _start(store, tenant, "echo hello")
    await _until(store, tenant, session_id, "waiting")
    changed = {"command": "echo goodbye"}

    await _vote(store, started, BOB, modified_arguments=changed)
    await _vote(store, started, BOB, modified_arguments=changed)
    await _vote(store, started, EVE, modified_arguments=changed)
    # Appended one after the other, so judged in this order: one grant of two so far.
    await _vote(store, started, CEM, modified_arguments=changed)

    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome
    log = [stored.event for stored in await store.read_all(tenant, session_id)]
    events = [e.data for e in log]
    (requested,) = [e for e in events if isinstance(e, ApprovalRequested)]
    (granted,) = [e for e in events if isinstance(e, ApprovalGranted)]
    (authorized,) = [call for _, call in authorizations(log)]
    assert not [e for e in events if isinstance(e, ToolCallDenied)]
    assert requested.arguments == {"command": "echo hello"}
    assert (requested.policy_hash or "").startswith("sha256:")
    assert [actor.id for actor in granted.decided_by] == ["bob", "cem"]
    assert granted.modified_arguments == changed
    assert authorized.arguments == changed
    assert authorized.policy_hash == requested.policy_hash
    assert "goodbye" in str(state.steps["cmd"].output)


async def test_the_cli_answers_each_decision_refused_counted_or_approved_with_changed_arguments(
    stack: PolicyStack, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    session_id, _ = await _start(store, tenant, "echo hello")
    await _until(store, tenant, session_id, "waiting")
    decide = ("approve", session_id, "--tenant", tenant, "--set", "command=echo changed")

    code, _, err = await helmline(*decide, "--as", "eve", "--role", "viewer")
    assert code == 1
    assert "refused: eve holds none of the roles that may decide (sre)" in err
    code, out, err = await helmline(*decide, "--as", "bob", "--role", "sre")
    assert code == 0, err
    assert "grant counted for cmd.1: 1 of 2 approvers" in out
    code, out, err = await helmline(*decide, "--as", "cem", "--role", "sre", "-m", "fine")
    assert code == 0, err
    assert "approved cmd.1: step cmd (run_command)" in out

    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome
    log = [stored.event for stored in await store.read_all(tenant, session_id)]
    events = [e.data for e in log]
    (refused,) = [e for e in events if isinstance(e, ApprovalDecisionRefused)]
    (counted,) = [e for e in events if isinstance(e, ApprovalVoteCounted)]
    (authorized,) = [call for _, call in authorizations(log)]
    assert (refused.decided_by.id, counted.decided_by.id) == ("eve", "bob")
    assert authorized.arguments == {"command": "echo changed"}
    assert state.approvals["cmd.1"].arguments == {"command": "echo hello"}
    assert "changed" in str(state.steps["cmd"].output)


async def test_approve_similar_lets_the_next_matching_call_run_and_stops_at_its_limit(
    stack: PolicyStack, store: EventStore, tenant: str
) -> None:
    commands = ("ls", "ls -a", "ls -l")
    playbook = Playbook(
        goal="three listings",
        steps=tuple(
            PlanStep(
                id=f"s{index}",
                tool="run_command",
                arguments={"command": command},
                depends_on=(f"s{index - 1}",) if index else (),
            )
            for index, command in enumerate(commands)
        ),
    )
    session_id = uuid.uuid4().hex
    started = new_event(
        SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=REQUESTER),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    await store.append(started)
    approver = Actor(id="ana", roles=("approver",))

    first = await _until(store, tenant, session_id, "waiting")
    (request,) = first.pending_approvals
    vote = ApprovalDecisionSubmitted(
        request_id=request.request_id, decision="grant", decided_by=approver, similar_limit=1
    )
    await store.append(started.derive(vote, source="test"))

    # s1 runs under the standing grant; s2 finds it used up and asks again.
    await eventually(
        lambda: _pending_step(store, tenant, session_id, "s2"), what="a request for s2"
    )
    again = (await store.load(tenant, session_id)).state
    (second,) = again.pending_approvals
    assert second.step_id == "s2"
    vote = ApprovalDecisionSubmitted(
        request_id=second.request_id, decision="grant", decided_by=approver
    )
    await store.append(started.derive(vote, source="test", key=second.request_id))

    state = await _until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome
    log = [stored.event for stored in await store.read_all(tenant, session_id)]
    authorized = {call.step_id: call for _, call in authorizations(log)}
    assert authorized["s1"].approval_request_id == request.request_id
    assert authorized["s2"].approval_request_id == second.request_id
    assert len([e for e in log if isinstance(e.data, ApprovalRequested)]) == 2
    assert state.approvals[request.request_id].similar_used == 1


async def _pending_step(store: EventStore, tenant: str, session_id: str, step_id: str) -> bool:
    state = (await store.load(tenant, session_id)).state
    return any(request.step_id == step_id for request in state.pending_approvals)


async def test_an_edited_policy_file_decides_the_next_call_and_an_invalid_edit_changes_nothing(
    stack: PolicyStack, store: EventStore, tenant: str
) -> None:
    log = stack.processes.data_dir / "approval.log"
    edited = (
        "rules:\n  - name: no-echo\n    tool: run_command\n    arguments:\n"
        "      command: {regex: '^echo '}\n    effect: deny\n    reason: not today\n"
        "  - name: the-rest\n    effect: allow\n"
    )
    async with stack.policy_in_force(edited):
        stack.policy.write_text("rules: [{name: broken}]\n")
        await eventually(
            lambda: "invalid; keeping" in log.read_text(), timeout_s=10, what="the refusal"
        )

        session_id, _ = await _start(store, tenant, "echo hello")
        state = await _until(store, tenant, session_id, "failed", "completed")
        events = [stored.event.data for stored in await store.read_all(tenant, session_id)]
        (denied,) = [e for e in events if isinstance(e, ToolCallDenied)]
        assert (denied.rule, denied.reason) == ("no-echo", "not today")
        assert denied.policy_hash == policy_hash(edited.encode())
        assert state.status == "failed"


async def test_a_plan_approved_once_runs_its_risky_steps_without_asking_again(
    stack: PolicyStack, store: EventStore, tenant: str
) -> None:
    reviewed = POLICY.replace("rules:", "plan_approval: {roles: [approver]}\nrules:", 1)
    async with stack.policy_in_force(reviewed):
        playbook = Playbook(
            goal="two listings",
            steps=(
                PlanStep(id="a", tool="run_command", arguments={"command": "ls"}),
                PlanStep(id="b", tool="run_command", arguments={"command": "ls -a"}),
                PlanStep(id="c", tool="echo", arguments={"message": "done"}),
            ),
        )
        session_id = uuid.uuid4().hex
        started = new_event(
            SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=REQUESTER),
            tenant=tenant,
            session_id=session_id,
            source="test",
        )
        await store.append(started)
        waiting = await _until(store, tenant, session_id, "waiting")
        (request,) = waiting.pending_approvals
        assert (request.scope, request.request_id) == ("plan", "plan-1")
        assert "a (run_command, rule listing-asks); b (run_command" in request.reason
        vote = ApprovalDecisionSubmitted(
            request_id="plan-1", decision="grant", decided_by=Actor(id="ana", roles=("approver",))
        )
        await store.append(started.derive(vote, source="test"))

        state = await _until(store, tenant, session_id, "completed", "failed")
        assert state.status == "completed", state.outcome
        log = [stored.event for stored in await store.read_all(tenant, session_id)]
        assert len([e for e in log if isinstance(e.data, ApprovalRequested)]) == 1
        authorized = {call.step_id: call for _, call in authorizations(log)}
        assert authorized["a"].approval_request_id == "plan-1"
        assert authorized["b"].approval_request_id == "plan-1"
        assert authorized["c"].approval_request_id is None


async def test_an_unanswered_request_escalates_to_another_role_which_may_then_decide(
    stack: PolicyStack, store: EventStore, tenant: str
) -> None:
    escalating = (
        "rules:\n  - name: listing-escalates\n    tool: run_command\n    arguments:\n"
        "      command: {regex: '^ls'}\n    effect: require_approval\n    approval:\n"
        "      roles: [approver]\n      expires_in: 1m\n      escalate_after: 2s\n"
        "      escalate_to: [sre-lead]\n  - name: the-rest\n    effect: allow\n"
    )
    async with stack.policy_in_force(escalating):
        session_id, started = await _start(store, tenant, "ls")
        waiting = await _until(store, tenant, session_id, "waiting")
        (request,) = waiting.pending_approvals
        assert request.approver_roles == ("approver",)

        async def escalated() -> bool:
            state = (await store.load(tenant, session_id)).state
            return state.approvals[request.request_id].approver_roles == ("sre-lead",)

        await eventually(escalated, timeout_s=15, what="the escalation")
        vote = ApprovalDecisionSubmitted(
            request_id=request.request_id,
            decision="grant",
            decided_by=Actor(id="lea", roles=("sre-lead",)),
        )
        await store.append(started.derive(vote, source="test"))
        state = await _until(store, tenant, session_id, "completed", "failed")
        assert state.status == "completed", state.outcome
