"""Every API endpoint over real HTTP against the running stack: commands, reads, errors,
roles and tenant isolation."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from pydantic import ValidationError

from helmline.api import new_api_key, split_api_key, store_api_key
from helmline.contracts import (
    ALL_API_KEYS,
    EVENTS_STREAM,
    KEYS_STREAM,
    Actor,
    SessionStarted,
    WorkspaceSnapshotsPruned,
    decode_event,
    new_event,
    tenant_filter,
)
from helmline.runtime import EventStore, reserve_ports
from helmline.runtime.testing import ServiceProcesses, checkpointed, eventually
from tests.api.conftest import Issuer, KeyMaker

HELLO: dict[str, Any] = {
    "goal": "write a note and count it",
    "steps": [
        {"id": "write", "tool": "write_file", "arguments": {"path": "n.txt", "content": "a\nb\n"}},
        {
            "id": "count",
            "tool": "run_command",
            "arguments": {"command": "wc -c n.txt"},
            "depends_on": ["write"],
        },
    ],
}


async def start(
    client: httpx.AsyncClient, headers: dict[str, str], playbook: dict[str, Any] = HELLO
) -> str:
    response = await client.post("/sessions", json={"playbook": playbook}, headers=headers)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    assert response.headers["location"] == f"/sessions/{session_id}"
    return session_id


async def until(
    client: httpx.AsyncClient, headers: dict[str, str], session_id: str, *statuses: str
) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        state: dict[str, Any] = (
            await client.get(f"/sessions/{session_id}", headers=headers)
        ).json()
        return state if state["status"] in statuses else None

    found: dict[str, Any] = await eventually(reached, timeout_s=30, what=f"status {statuses}")
    return found


async def waiting_request(
    client: httpx.AsyncClient, headers: dict[str, str], session_id: str
) -> str:
    state = await until(client, headers, session_id, "waiting")
    pending: list[str] = [r for r, a in state["approvals"].items() if a["status"] == "pending"]
    (request_id,) = pending
    return request_id


def assert_problem(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert body["title"]
    for word in words:
        assert word in body["detail"], body


async def test_health_and_readiness_need_no_credential(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"service": "api", "status": "alive"}
    assert (await client.get("/readyz")).status_code == 200


async def test_openapi_lists_every_route(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {
        "/sessions",
        "/sessions/{session_id}",
        "/sessions/{session_id}/checkpoints",
        "/sessions/{session_id}/approvals/{request_id}",
        "/sessions/{session_id}/pause",
        "/sessions/{session_id}/resume",
        "/sessions/{session_id}/cancel",
        "/sessions/{session_id}/rollback",
        "/sessions/{session_id}/fork",
        "/sessions/{session_id}/events",
        "/sessions/{session_id}/overview",
        "/sessions/{session_id}/steps",
        "/sessions/{session_id}/steps/{step_id}",
        "/sessions/{session_id}/calls",
        "/sessions/{session_id}/rollback-points",
        "/sessions/{session_id}/thoughts",
        "/sessions/{session_id}/log",
        "/sessions/{session_id}/changes",
        "/events",
        "/tools",
        "/keys",
        "/keys/{key_id}",
        "/keys/{key_id}/rotate",
        "/healthz",
        "/readyz",
    } <= set(paths)
    assert (await client.get("/docs")).status_code == 200


async def test_without_a_valid_credential_the_answer_is_401(
    client: httpx.AsyncClient, tenant: str
) -> None:
    assert_problem(await client.get("/sessions"), 401, "API key")
    # A key cut short or mistyped in its shape, and a well-formed key nobody made, are told
    # apart.
    malformed = {"Authorization": "Bearer hlk_0123456789abcdef_not-a-secret"}
    assert_problem(await client.get("/sessions", headers=malformed), 401, "malformed", "hlk_<")
    unknown = {"Authorization": f"Bearer hlk_0123456789abcdef_{'x' * 43}"}
    refused = await client.get("/sessions", headers=unknown)
    assert_problem(refused, 401, "not known")
    assert "malformed" not in refused.json()["detail"]
    assert_problem(
        await client.get("/sessions", headers={"Authorization": "Bearer not.a.jwt"}),
        401,
        "bearer token was refused",
    )


async def test_a_playbook_session_waits_for_approval_and_is_listed_with_what_it_waits_for(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    admin = await make_key(tenant, "admin")
    created = await client.post("/sessions", json={"playbook": HELLO}, headers=admin)
    session_id, started_seq = created.json()["session_id"], created.json()["seq"]
    request_id = await waiting_request(client, admin, session_id)

    async def listed() -> list[dict[str, Any]]:
        response = await client.get(
            "/sessions", params={"status": "waiting", "waiting": "true"}, headers=admin
        )
        assert response.status_code == 200, response.text
        return [s for s in response.json() if s["session_id"] == session_id]

    (summary,) = await eventually(listed, timeout_s=30, what="session in the list")
    assert summary["waiting_for"][0]["request_id"] == request_id
    assert summary["waiting_for"][0]["tool"] == "run_command"
    assert summary["goal"] == HELLO["goal"]
    assert summary["last_seq"] > started_seq  # The line says how far into the log it is.
    done = await client.get("/sessions", params={"status": "completed"}, headers=admin)
    assert all(s["session_id"] != session_id for s in done.json())

    first = await client.get(
        f"/sessions/{session_id}", params={"at_seq": started_seq}, headers=admin
    )
    assert first.json()["event_count"] == 1
    assert first.json()["status"] in ("pending", "planning")

    await checkpointed(store, tenant, session_id)  # Made off the steps' path.
    checkpoints = (await client.get(f"/sessions/{session_id}/checkpoints", headers=admin)).json()
    assert [c["step_id"] for c in checkpoints] == ["write"]


async def test_a_grant_with_modified_arguments_runs_them_and_records_the_comment(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    operator = await make_key(tenant, "operator")
    approver = await make_key(tenant, "approver")
    session_id = await start(client, operator)
    request_id = await waiting_request(client, approver, session_id)
    decision = {
        "decision": "grant",
        "comment": "lines, not bytes",
        "modified_arguments": {"command": "wc -l n.txt"},
    }
    url = f"/sessions/{session_id}/approvals/{request_id}"
    # Arguments the tool's schema refuses are named at once, and nothing is appended.
    wrong = {**decision, "modified_arguments": {"command": 5}}
    refused = await client.post(url, json=wrong, headers=approver)
    assert_problem(refused, 422, "body.modified_arguments.command", "run_command")
    logged = [s.event.type for s in await store.read_all(tenant, session_id)]
    assert "approval.decision_submitted" not in logged
    accepted = await client.post(url, json=decision, headers=approver)
    assert accepted.status_code == 202
    state = await until(client, approver, session_id, "completed", "failed")
    assert state["status"] == "completed", state["outcome"]
    assert state["steps"]["count"]["output"]["stdout"].strip().startswith("2")
    # The approval service's answer names the decision the API appended as its cause.
    (granted,) = [
        s.event
        for s in await store.read_all(tenant, session_id)
        if s.event.type == "approval.granted"
    ]
    assert str(granted.causation_id) == accepted.json()["event_id"]
    approval = state["approvals"][request_id]
    assert approval["comment"] == "lines, not bytes"
    assert approval["modified_arguments"] == {"command": "wc -l n.txt"}
    assert_problem(await client.post(url, json=decision, headers=approver), 409, "already")


async def test_a_grant_may_stand_for_similar_calls_until_a_given_time(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    approver = await make_key(tenant, "approver")
    session_id = await start(client, operator)
    request_id = await waiting_request(client, approver, session_id)
    url = f"/sessions/{session_id}/approvals/{request_id}"
    until_then = (datetime.now(UTC) + timedelta(minutes=30)).replace(microsecond=0)
    for wrong, words in (
        ({"decision": "deny", "similar_limit": 2}, "only go with a grant"),
        ({"decision": "grant", "similar_until": until_then.isoformat()}, "go with similar_limit"),
        (
            {"decision": "grant", "similar_limit": 2, "similar_where": {"command": {}}},
            "an argument condition needs glob, regex, min or max",
        ),
        (
            {"decision": "grant", "similar_limit": 2, "similar_where": {"colour": {"glob": "r*"}}},
            "body.similar_where.colour",
        ),
        (
            {"decision": "grant", "similar_limit": 2, "similar_until": "2020-01-01T00:00:00Z"},
            "not in the future",
        ),
        (
            {"decision": "grant", "similar_limit": 2, "similar_until": "2030-01-01T00:00"},
            "timezone",
        ),
    ):
        assert_problem(await client.post(url, json=wrong, headers=approver), 422, words)

    grant = {
        "decision": "grant",
        "similar_limit": 2,
        "similar_until": until_then.isoformat(),
        "similar_where": {"command": {"regex": "^wc "}},
    }
    assert (await client.post(url, json=grant, headers=approver)).status_code == 202
    state = await until(client, approver, session_id, "completed", "failed")
    approval = state["approvals"][request_id]
    assert approval["similar_limit"] == 2
    assert datetime.fromisoformat(approval["similar_until"]) == until_then
    assert approval["similar_where"]["command"]["regex"] == "^wc "


async def test_a_denial_fails_the_session(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin)
    request_id = await waiting_request(client, admin, session_id)
    response = await client.post(
        f"/sessions/{session_id}/approvals/{request_id}",
        json={"decision": "deny", "comment": "no commands today"},
        headers=admin,
    )
    assert response.status_code == 202
    state = await until(client, admin, session_id, "failed", "completed")
    assert state["status"] == "failed"
    assert "no commands today" in state["outcome"]


async def test_each_role_may_do_only_its_part(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    viewer = await make_key(tenant, "viewer")
    operator = await make_key(tenant, "operator")
    approver = await make_key(tenant, "approver")
    assert_problem(
        await client.post("/sessions", json={"playbook": HELLO}, headers=viewer), 403, "operator"
    )
    session_id = await start(client, operator)
    request_id = await waiting_request(client, viewer, session_id)
    grant = {"decision": "grant"}
    url = f"/sessions/{session_id}/approvals/{request_id}"
    assert_problem(await client.post(url, json=grant, headers=operator), 403, "approver")
    assert_problem(await client.post(url, json=grant, headers=viewer), 403, "approver")
    for control in ("pause", "cancel"):
        response = await client.post(f"/sessions/{session_id}/{control}", json={}, headers=approver)
        assert_problem(response, 403, "operator")
    assert (await client.get(f"/sessions/{session_id}", headers=viewer)).status_code == 200


async def test_another_tenants_session_is_not_found(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    owner = await make_key(tenant, "admin")
    stranger = await make_key(f"{tenant}-b", "admin")
    session_id = await start(client, owner)
    request_id = await waiting_request(client, owner, session_id)
    base = f"/sessions/{session_id}"
    for response in (
        await client.get(base, headers=stranger),
        await client.get(f"{base}/checkpoints", headers=stranger),
        await client.get(f"{base}/rollback-points", headers=stranger),
        await client.get(f"{base}/thoughts", headers=stranger),
        await client.get(f"{base}/events", headers=stranger),
        await client.post(f"{base}/pause", json={}, headers=stranger),
        await client.post(f"{base}/fork", json={"checkpoint_id": "c"}, headers=stranger),
        await client.post(
            f"{base}/approvals/{request_id}", json={"decision": "grant"}, headers=stranger
        ),
    ):
        assert_problem(response, 404, session_id)
    listed = (await client.get("/sessions", headers=stranger)).json()
    assert all(s["session_id"] != session_id for s in listed)


async def test_pause_resume_and_cancel_become_events_and_an_ended_session_refuses_them(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    session_id = await start(client, operator)
    request_id = await waiting_request(client, operator, session_id)
    base = f"/sessions/{session_id}"
    paused = await client.post(f"{base}/pause", json={"reason": "lunch"}, headers=operator)
    assert paused.status_code == 202
    state = await until(client, operator, session_id, "paused", "waiting")
    assert state["pause_requested"] is True
    assert (await client.post(f"{base}/resume", headers=operator)).status_code == 202
    # A reason is optional: the body may be left out.
    cancelled = await client.post(f"{base}/cancel", headers=operator)
    assert cancelled.status_code == 202, cancelled.text
    state = await until(client, operator, session_id, "cancelled")
    assert_problem(await client.post(f"{base}/pause", headers=operator), 409, "ended")
    # The request it waited on is withdrawn: a grant now would run a cancelled session's step.
    assert state["approvals"][request_id]["status"] == "withdrawn"
    admin = await make_key(tenant, "admin")
    granted = await client.post(
        f"{base}/approvals/{request_id}", json={"decision": "grant"}, headers=admin
    )
    assert_problem(granted, 409, "already withdrawn")


async def test_rollback_and_fork_append_their_events(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    operator = await make_key(tenant, "operator")
    session_id = await start(client, operator)
    await waiting_request(client, operator, session_id)
    base = f"/sessions/{session_id}"
    missing = await client.post(
        f"{base}/rollback", json={"checkpoint_id": "nope"}, headers=operator
    )
    assert_problem(missing, 404, "nope")
    await checkpointed(store, tenant, session_id)  # Made off the steps' path.
    (checkpoint,) = (await client.get(f"{base}/checkpoints", headers=operator)).json()
    rolled = await client.post(
        f"{base}/rollback", json={"checkpoint_id": checkpoint["checkpoint_id"]}, headers=operator
    )
    assert rolled.status_code == 202
    requested = [
        s.event.data
        for s in await store.read_all(tenant, session_id)
        if s.seq == rolled.json()["seq"]
    ]
    assert requested[0].TYPE == "rollback.requested"

    origin = {"checkpoint_id": checkpoint["checkpoint_id"]}
    forked = await client.post(f"{base}/fork", json=origin, headers=operator)
    assert forked.status_code == 201, forked.text
    (first,) = await store.read_all(
        tenant, forked.json()["session_id"], up_to_seq=forked.json()["seq"]
    )
    assert isinstance(first.event.data, SessionStarted)
    assert first.event.data.fork_of is not None
    assert first.event.data.fork_of.session_id == session_id
    assert first.event.data.fork_of.at_seq == checkpoint["at_seq"]
    assert first.event.data.fork_of.completed_steps == ("write",)
    assert first.event.data.playbook is not None

    # Once the checkpoint's snapshot is pruned, no fork can start from its workspace.
    assert checkpoint["snapshot_id"]
    pruned = WorkspaceSnapshotsPruned(snapshot_ids=(checkpoint["snapshot_id"],), reason="kept 1")
    await store.append(new_event(pruned, tenant=tenant, session_id=session_id, source="test"))
    refused = await client.post(f"{base}/fork", json=origin, headers=operator)
    assert_problem(refused, 409, "is not kept (pruned: kept 1): fork from a later checkpoint")


async def test_tools_are_listed_with_their_schemas(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    tools = (await client.get("/tools", headers=await make_key(tenant, "viewer"))).json()
    by_name = {tool["name"]: tool for tool in tools}
    assert by_name["run_command"]["risk"] == "high"
    assert "command" in by_name["run_command"]["parameters"]["properties"]


async def test_invalid_input_is_one_problem_that_names_each_field(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    assert_problem(
        await client.post("/sessions", json={}, headers=operator), 422, "goal, a playbook"
    )
    cyclic = {
        "goal": "loop",
        "steps": [
            {"id": "a", "tool": "echo", "depends_on": ["b"]},
            {"id": "b", "tool": "echo", "depends_on": ["a"]},
        ],
    }
    response = await client.post("/sessions", json={"playbook": cyclic}, headers=operator)
    assert_problem(response, 422, "body.playbook")
    assert "cycle" in response.json()["detail"]
    bad_limit = await client.get("/sessions", params={"limit": 0}, headers=operator)
    assert_problem(bad_limit, 422, "query.limit")
    assert bad_limit.json()["errors"][0]["field"] == "query.limit"
    assert_problem(
        await client.get("/sessions/not..valid", headers=operator), 422, "path.session_id"
    )


async def test_a_playbook_with_an_unknown_tool_or_bad_arguments_starts_nothing(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    operator = await make_key(tenant, "operator")
    playbook = {
        "goal": "bad steps",
        "steps": [
            {"id": "a", "tool": "no_such_tool"},
            {"id": "b", "tool": "run_command", "arguments": {"command": "ls", "timeout_s": -3}},
            {"id": "c", "tool": "read_file", "arguments": {"path": "x", "colour": "red"}},
        ],
    }

    response = await client.post("/sessions", json={"playbook": playbook}, headers=operator)

    assert_problem(response, 422, "unknown tool 'no_such_tool'")
    fields = {problem["field"]: problem["message"] for problem in response.json()["errors"]}
    assert set(fields) == {
        "body.playbook.steps.0.tool",
        "body.playbook.steps.1.arguments.timeout_s",
        "body.playbook.steps.2.arguments.colour",
    }
    assert "(arguments of run_command)" in fields["body.playbook.steps.1.arguments.timeout_s"]
    assert await store.read_matching(tenant_filter(tenant)) == []


async def test_a_session_too_large_for_the_log_is_refused_and_nothing_is_appended(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    operator = await make_key(tenant, "operator")
    # Within the API's body limit (1 MiB), but not once in an event with its envelope.
    labels = {"notes": "x" * (EVENTS_STREAM.max_msg_size - 200)}

    response = await client.post(
        "/sessions", json={"goal": "g", "labels": labels}, headers=operator
    )

    # Not "try again": the same request can never fit.
    assert_problem(response, 413, "larger than the log takes", "nothing was appended")
    assert await store.read_matching(tenant_filter(tenant)) == []


async def test_a_goal_starts_a_planned_session(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    operator = await make_key(tenant, "operator")
    response = await client.post("/sessions", json={"goal": "tidy up"}, headers=operator)
    assert response.status_code == 201
    (started,) = await store.read_all(
        tenant, response.json()["session_id"], up_to_seq=response.json()["seq"]
    )
    assert isinstance(started.event.data, SessionStarted)
    assert (started.event.data.goal, started.event.data.mode) == ("tidy up", "plan")
    assert started.event.data.requested_by.id.startswith("key:")


async def test_a_keys_permissions_reach_its_sessions_and_grant_no_api_right(
    client: httpx.AsyncClient, js: JetStreamContext, tenant: str, store: EventStore
) -> None:
    async def key_of(*roles: str) -> dict[str, str]:
        key, record = new_api_key(tenant, roles, name="ci", permissions=("repo.write",))
        await store_api_key(js, record, by=Actor(id="test"))
        return {"Authorization": f"Bearer {key}"}

    viewer = await key_of("viewer")
    me = await client.get("/me", headers=viewer)
    assert me.json()["roles"] == ["repo.write", "viewer"]
    assert_problem(
        await client.post("/sessions", json={"goal": "x"}, headers=viewer), 403, "operator"
    )

    response = await client.post("/sessions", json={"goal": "x"}, headers=await key_of("operator"))
    assert response.status_code == 201
    (started,) = await store.read_all(
        tenant, response.json()["session_id"], up_to_seq=response.json()["seq"]
    )
    assert isinstance(started.event.data, SessionStarted)
    assert "repo.write" in started.event.data.requested_by.roles
    # A permission named like a role would grant that role's rights.
    with pytest.raises(ValidationError, match="permissions"):
        new_api_key(tenant, ("viewer",), permissions=("admin",))


async def test_oidc_tokens_signed_by_the_issuer_carry_tenant_and_roles(
    client: httpx.AsyncClient, issuer: Issuer, tenant: str
) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    good = issuer.token(tenant=tenant, roles=["viewer", "approver"])
    me = await client.get("/me", headers={"Authorization": f"Bearer {good}"})
    assert me.json() == {"id": "ana", "tenant": tenant, "roles": ["approver", "viewer"]}
    forged = issuer.token(
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048), tenant=tenant
    )
    for token, why in (
        (forged, "Signature"),
        (issuer.token(tenant=tenant, exp=1), "expired"),
        (issuer.token(tenant=tenant, aud="someone-else"), "Audience"),
        (issuer.token(tenant="Not A Tenant"), "tenant"),
    ):
        response = await client.get("/me", headers={"Authorization": f"Bearer {token}"})
        assert_problem(response, 401, why)
    viewer_only = issuer.token(tenant=tenant, roles="viewer")
    refused = await client.post(
        "/sessions", json={"goal": "x"}, headers={"Authorization": f"Bearer {viewer_only}"}
    )
    assert_problem(refused, 403, "operator")


async def key_events(js: JetStreamContext, key_id: str) -> list[str]:
    """The types of a key's events on the keys stream, in order."""
    types: list[str] = []
    subscription = await js.subscribe(
        ALL_API_KEYS, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    pending = (await js.stream_info(KEYS_STREAM.name)).state.last_seq
    try:
        while pending:
            message = await subscription.next_msg(timeout=5)
            event = decode_event(message.data)
            if getattr(event.data, "key_id", None) == key_id:
                types.append(event.type)
            if message.metadata.sequence.stream >= pending:
                break
    finally:
        await subscription.unsubscribe()
    return types


async def test_admins_make_list_rotate_and_revoke_their_tenants_keys(
    client: httpx.AsyncClient, make_key: KeyMaker, js: JetStreamContext, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    assert_problem(await client.get("/keys", headers=await make_key(tenant, "operator")), 403)

    made = await client.post(
        "/keys", json={"roles": ["viewer"], "name": "ci", "expires_in_s": 3600}, headers=admin
    )
    assert made.status_code == 201, made.text
    first = made.json()["key"]
    key_id = made.json()["key_id"]
    assert made.json()["tenant"] == tenant
    holder = {"Authorization": f"Bearer {first}"}
    assert (await client.get("/me", headers=holder)).status_code == 200

    async def listed() -> dict[str, Any]:
        keys = (await client.get("/keys", headers=admin)).json()
        # The list follows the keys stream: a key just made may not be in it yet.
        shown = [k for k in keys if k["key_id"] == key_id]
        return shown[0] if shown and shown[0]["last_used_at"] else {}

    # Its last use is recorded off the request, and neither the secret nor its hash is shown.
    shown = await eventually(listed, what="the key's last use")
    assert shown["roles"] == ["viewer"]
    assert shown["revoked_at"] is None
    assert "key" not in shown
    assert "secret_sha256" not in shown
    listed_text = (await client.get("/keys", headers=admin)).text
    parts = split_api_key(first)
    assert parts is not None
    assert parts[1] not in listed_text

    rotated = await client.post(f"/keys/{key_id}/rotate", headers=admin)
    assert rotated.status_code == 200, rotated.text
    second = {"Authorization": f"Bearer {rotated.json()['key']}"}
    assert rotated.json()["key_id"] == key_id
    assert rotated.json()["key"] != first
    assert_problem(await client.get("/me", headers=holder), 401, "not known")
    assert (await client.get("/me", headers=second)).status_code == 200

    revoked = await client.request(
        "DELETE", f"/keys/{key_id}", json={"reason": "leaked"}, headers=admin
    )
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revoked_at"]
    assert_problem(await client.get("/me", headers=second), 401, "revoked")
    assert_problem(await client.post(f"/keys/{key_id}/rotate", headers=admin), 409, "revoked")
    assert await key_events(js, key_id) == ["api.key.created", "api.key.rotated", "api.key.revoked"]

    # Another tenant's admin finds no such key.
    other = await make_key(f"{tenant}-other", "admin")
    assert_problem(await client.request("DELETE", f"/keys/{key_id}", headers=other), 404)


async def test_an_expired_key_is_refused_with_when_it_expired(
    client: httpx.AsyncClient, js: JetStreamContext, tenant: str
) -> None:
    key, record = new_api_key(tenant, ("viewer",), name="short")
    past = record.model_copy(update={"expires_at": record.created_at - timedelta(seconds=1)})
    await store_api_key(js, past, by=Actor(id="test"))
    expired = await client.get("/me", headers={"Authorization": f"Bearer {key}"})
    assert_problem(expired, 401, "expired at")


async def test_a_key_revoked_through_one_replica_is_refused_by_another_within_a_second(
    nats_url: str, make_key: KeyMaker, tenant: str, tmp_path: Path
) -> None:
    admin = await make_key(tenant, "admin")
    holder = await make_key(tenant, "viewer")
    replicas = [ServiceProcesses(nats_url, tmp_path / str(n)) for n in (1, 2)]
    ports = reserve_ports(2)
    try:
        for replica, port in zip(replicas, ports, strict=True):
            replica.data_dir.mkdir()
            replica.start("api", env={"HELMLINE_API_PORT": str(port)})
        one, two = (
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) for port in ports
        )
        async with one, two:
            # The second replica has the key cached: only the event can tell it.
            assert (await two.get("/me", headers=holder)).status_code == 200
            (key_id,) = [
                k["key_id"]
                for k in (await one.get("/keys", headers=admin)).json()
                if k["name"] == f"{tenant}-viewer"
            ]
            revoked = await one.request("DELETE", f"/keys/{key_id}", headers=admin)
            assert revoked.status_code == 200, revoked.text
            started = time.monotonic()

            async def refused() -> bool:
                return (await two.get("/me", headers=holder)).status_code == 401

            await eventually(refused, timeout_s=1.0, interval_s=0.005, what="refused by replica 2")
            print(
                f"revoked key refused by the other replica after {time.monotonic() - started:.4f} s"
            )
    finally:
        for replica in replicas:
            replica.stop_all()
