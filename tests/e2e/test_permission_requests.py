"""Permission requests across the services as processes, decided from the CLI: a playbook step
that reaches a network host its rule does not grant asks for it (`permission.requested`)
instead of failing; granted for the session until a time, it runs, and so do later steps
needing the host while the grant holds; denied, the step is denied as the policy says; once
the grant has ended, a step needing the host asks again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from helmline.contracts import (
    Actor,
    ApprovalGranted,
    Payload,
    PermissionRequested,
    PlanStep,
    Playbook,
    SessionState,
    ToolCallDenied,
    ToolCallStarted,
    authorizations,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, ended, eventually, start_playbook

from .conftest import SERVICES, Helmline
from .test_approval_policy import PolicyStack

POLICY = """
permission_requests: {roles: [approver, admin], expires_in: 10m, grant_expires_in: 1h}
rules:
  - name: status-page-only
    tool: run_command
    hosts: [status.example.com]
    effect: allow
"""
REQUESTER = Actor(id="ana", roles=("operator",))
HOST = "api.example.com"


@pytest.fixture(scope="module")
def stack(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyStack]:
    folder = tmp_path_factory.mktemp("permissions-stack")
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    running = PolicyStack(ServiceProcesses(nats_url, folder), policy)
    try:
        for name in SERVICES:
            running.start(name)
        yield running
    finally:
        running.processes.stop_all()


def _step(step_id: str, command: str, *hosts: str, after: str | None = None) -> PlanStep:
    return PlanStep(
        id=step_id,
        tool="run_command",
        arguments={"command": command},
        hosts=hosts,
        depends_on=(after,) if after else (),
    )


async def _asked(
    store: EventStore, tenant: str, session_id: str, request_id: str
) -> tuple[SessionState, PermissionRequested]:
    """Wait until the session asks for a permission by `request_id`."""

    async def asked() -> tuple[SessionState, PermissionRequested] | None:
        events = [s.event.data for s in await store.read_all(tenant, session_id)]
        found = [
            e for e in events if isinstance(e, PermissionRequested) and e.request_id == request_id
        ]
        if not found:
            return None
        return (await store.load(tenant, session_id)).state, found[0]

    result: tuple[SessionState, PermissionRequested] = await eventually(
        asked, timeout_s=30, what=f"permission request {request_id}"
    )
    return result


async def _payloads(store: EventStore, tenant: str, session_id: str) -> list[Payload]:
    return [stored.event.data for stored in await store.read_all(tenant, session_id)]


async def test_a_host_granted_from_the_cli_for_the_session_lets_its_steps_run(
    stack: PolicyStack, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    playbook = Playbook(
        goal="reach the api twice, and the status page",
        steps=(
            _step("fetch", "echo fetched", HOST),
            _step("again", "echo again", HOST, after="fetch"),
            _step("status", "echo status", "status.example.com", after="again"),
        ),
    )
    session_id = await start_playbook(store, tenant, playbook, REQUESTER)
    state, asked = await _asked(store, tenant, session_id, "permission-fetch.1")
    assert state.status == "waiting"
    ((kind, name),) = [(need.kind, need.name) for need in asked.permissions]
    assert (kind, name, asked.rule) == ("network", HOST, "status-page-only")
    assert "rule status-page-only grants only hosts matching 'status.example.com'" in asked.reason
    so_far = await _payloads(store, tenant, session_id)
    assert not any(isinstance(e, ToolCallStarted) for e in so_far)

    # The approval queue of the CLI lists it, with what it asks for.
    code, out, err = await helmline("approvals", "--tenant", tenant, "--json")
    assert code == 0, err
    (queued,) = [r for r in json.loads(out) if r["session_id"] == session_id]
    assert queued["request_id"] == "permission-fetch.1"
    assert queued["permissions"][0]["name"] == HOST

    before = datetime.now(UTC)
    code, out, err = await helmline(
        "approve", session_id, "--tenant", tenant, "--for", "session", "--expires-in", "10m"
    )
    assert code == 0, err
    assert f"granted permission-fetch.1: network {HOST} for the session until" in out

    final = await ended(store, tenant, session_id)
    assert final.status == "completed", final.outcome
    events = await _payloads(store, tenant, session_id)
    (granted,) = [e for e in events if isinstance(e, ApprovalGranted)]
    assert granted.grant_scope == "session"
    assert granted.grant_until is not None
    assert (
        before + timedelta(minutes=9)
        < granted.grant_until
        <= datetime.now(UTC) + timedelta(minutes=10)
    )
    # Asked once: the later step ran under the session's grant, the last under its rule.
    assert [e.request_id for e in events if isinstance(e, PermissionRequested)] == [
        "permission-fetch.1"
    ]
    log = [stored.event for stored in await store.read_all(tenant, session_id)]
    authorized = {call.call_id: call for _, call in authorizations(log)}
    assert set(authorized) == {"fetch.1", "again.1", "status.1"}
    assert all(call.network for call in authorized.values())
    assert final.steps["again"].output is not None


async def test_a_permission_denied_from_the_cli_denies_the_step_as_the_policy_says(
    stack: PolicyStack, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    playbook = Playbook(goal="reach the api", steps=(_step("fetch", "echo fetched", HOST),))
    session_id = await start_playbook(store, tenant, playbook, REQUESTER)
    await _asked(store, tenant, session_id, "permission-fetch.1")

    code, _, err = await helmline("approve", session_id, "--tenant", tenant, "--request", "nope")
    assert code == 1
    assert "has no approval request nope; pending: permission-fetch.1" in err
    code, _, err = await helmline(
        "approve", session_id, "--tenant", tenant, "--similar", "2", "--for", "session"
    )
    assert code == 2
    assert "asks for a permission, granted as asked" in err
    code, _, err = await helmline(
        "approve", session_id, "--tenant", tenant, "--as", "vic", "--role", "viewer"
    )
    assert code == 1
    assert "vic holds none of the roles that may decide (approver, admin)" in err

    code, out, err = await helmline("deny", session_id, "--tenant", tenant, "-m", "not that host")
    assert code == 0, err
    assert "denied permission-fetch.1" in out
    final = await ended(store, tenant, session_id)
    assert final.status == "failed"  # The playbook's default: a denied step fails it.
    assert final.steps["fetch"].status == "denied"
    events = await _payloads(store, tenant, session_id)
    (denied,) = [e for e in events if isinstance(e, ToolCallDenied)]
    assert denied.approval_request_id == "permission-fetch.1"
    assert denied.reason.endswith(": not that host")
    assert not any(isinstance(e, ToolCallStarted) for e in events)

    code, _, err = await helmline("deny", session_id, "--tenant", tenant)
    assert code == 1
    assert "no pending approval request" in err


async def test_once_the_grant_has_ended_a_step_needing_the_host_asks_again(
    stack: PolicyStack, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    playbook = Playbook(
        goal="reach the api, wait past the grant, reach it again",
        steps=(
            _step("fetch", "echo fetched", HOST),
            # Outlasts the grant below: the next step is judged after it ended.
            _step("wait", "sleep 6", after="fetch"),
            _step("later", "echo later", HOST, after="wait"),
        ),
    )
    session_id = await start_playbook(store, tenant, playbook, REQUESTER)
    await _asked(store, tenant, session_id, "permission-fetch.1")
    code, _, err = await helmline(
        "approve", session_id, "--tenant", tenant, "--for", "session", "--expires-in", "5s"
    )
    assert code == 0, err

    state, asked = await _asked(store, tenant, session_id, "permission-later.1")
    assert state.steps["fetch"].status == "succeeded"
    assert state.steps["wait"].status == "succeeded"
    granted = state.approvals["permission-fetch.1"]
    assert granted.grant_until is not None
    assert granted.grant_until < datetime.now(UTC)
    assert asked.permissions[0].name == HOST
    assert state.status == "waiting"

    code, _, err = await helmline("deny", session_id, "--tenant", tenant)
    assert code == 0, err
    final = await ended(store, tenant, session_id)
    assert final.status == "failed"
    assert final.steps["later"].status == "denied"


async def test_a_request_nobody_decided_in_time_expires_and_is_refused_after(
    stack: PolicyStack, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    playbook = Playbook(goal="reach the api", steps=(_step("fetch", "echo fetched", HOST),))
    async with stack.policy_in_force(POLICY.replace("expires_in: 10m", "expires_in: 1s")):
        session_id = await start_playbook(store, tenant, playbook, REQUESTER)
        final = await ended(store, tenant, session_id)
    assert final.status == "failed"
    assert final.approvals["permission-fetch.1"].status == "expired"
    assert final.steps["fetch"].reason == "nobody decided before the permission request expired"

    code, _, err = await helmline(
        "approve", session_id, "--tenant", tenant, "--request", "permission-fetch.1"
    )
    assert code == 1
    assert "approval request permission-fetch.1 is already expired" in err
