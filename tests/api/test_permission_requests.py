"""Permission requests over HTTP: a session whose step reaches a network host no rule grants
waits for it; an approver grants it for the session until a time, and nothing else may
(a viewer, another tenant's approver, a decision that does not fit the request's kind, a
request unknown or already decided is refused with what was wrong)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from helmline.runtime.testing import eventually
from tests.api.conftest import KeyMaker
from tests.api.test_api import assert_problem, start, until, waiting_request

HOST = "api.example.com"
REACHING: dict[str, Any] = {
    "goal": "say hello to the api",
    "steps": [{"id": "say", "tool": "echo", "arguments": {"message": "hi"}, "hosts": [HOST]}],
}


def _in(minutes: float) -> str:
    return (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()


async def test_an_approver_grants_a_permission_for_the_session_and_nobody_else_may(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    approver = await make_key(tenant, "approver")
    viewer = await make_key(tenant, "viewer")
    stranger = await make_key(f"{tenant}-other", "approver")
    session_id = await start(client, operator, REACHING)
    request_id = await waiting_request(client, viewer, session_id)
    assert request_id == "permission-say.1"
    state = (await client.get(f"/sessions/{session_id}", headers=viewer)).json()
    asked = state["approvals"][request_id]
    assert [(n["kind"], n["name"]) for n in asked["permissions"]] == [("network", HOST)]
    assert "rule allow-low-and-medium-risk grants no network host" in asked["reason"]

    async def listed_as_waiting() -> bool:
        # The list is read from the read model, which follows the log a moment behind.
        listed = (await client.get("/sessions?waiting=true", headers=viewer)).json()
        return any(s["session_id"] == session_id for s in listed)

    await eventually(listed_as_waiting, timeout_s=30, what="the session listed as waiting")

    url = f"/sessions/{session_id}/approvals/{request_id}"
    grant = {"decision": "grant", "grant_scope": "session", "grant_until": _in(30)}
    assert_problem(await client.post(url, json=grant, headers=viewer), 403, "approver")
    assert_problem(
        await client.post(url, json=grant, headers=stranger), 404, f"session {session_id}"
    )
    assert_problem(
        await client.post(f"/sessions/{session_id}/approvals/nope", json=grant, headers=approver),
        404,
        "has no approval request nope",
    )
    similar = {**grant, "similar_limit": 2}
    assert_problem(
        await client.post(url, json=similar, headers=approver),
        422,
        "a permission request is granted as asked",
    )
    past = {**grant, "grant_until": _in(-1)}
    assert_problem(
        await client.post(url, json=past, headers=approver), 422, "grant_until is not in the future"
    )
    denied_with_scope = {"decision": "deny", "grant_scope": "step"}
    assert_problem(
        await client.post(url, json=denied_with_scope, headers=approver),
        422,
        "only go with a grant",
    )

    accepted = await client.post(url, json=grant, headers=approver)
    assert accepted.status_code == 202, accepted.text
    done = await until(client, viewer, session_id, "completed", "failed")
    assert done["status"] == "completed", done["outcome"]
    decided = done["approvals"][request_id]
    assert (decided["status"], decided["grant_scope"]) == ("granted", "session")
    lasting = datetime.fromisoformat(decided["grant_until"]) - datetime.now(UTC)
    assert timedelta(minutes=25) < lasting <= timedelta(minutes=30)
    assert done["steps"]["say"]["output"] is not None
    assert_problem(await client.post(url, json=grant, headers=approver), 409, "is already granted")


async def test_a_grant_scope_on_an_approval_of_a_call_is_refused(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin)
    request_id = await waiting_request(client, admin, session_id)
    url = f"/sessions/{session_id}/approvals/{request_id}"
    response = await client.post(
        url, json={"decision": "grant", "grant_scope": "session"}, headers=admin
    )
    assert_problem(response, 422, "only for permission requests", "asks to approve a call")
    assert (await client.post(url, json={"decision": "deny"}, headers=admin)).status_code == 202
