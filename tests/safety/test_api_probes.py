"""API: every operation of the published OpenAPI document probed as an attacker would: with
no key, with malformed keys, with another tenant's admin key aimed at this tenant's session,
approval request and key, with a viewer's key on every write, with an oversized body; and the
event stream resumed from before another tenant's events. Leaks (an answer that grants, a
server error, another tenant's data in an answer, a change to the victim's log): 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from helmline.contracts import Actor, PlanStep, Playbook, SessionState
from helmline.runtime.testing import eventually, start_playbook
from tests.safety import figures
from tests.safety.openapi import Operation, least_body, operations
from tests.safety.places import sse_until
from tests.safety.stack import Stack

pytestmark = pytest.mark.stack

OVERSIZED_BYTES = 8 << 20
"""Far past any size a request of this API needs (item 6 sets the documented limits)."""


@dataclass
class Victim:
    """A tenant with something to steal: a session waiting on an approval, a key."""

    tenant: str
    session_id: str
    request_id: str
    key_id: str
    marker: str
    """In the session's goal: found in an answer to someone else, it leaked."""
    admin: dict[str, str]
    viewer: dict[str, str]

    @property
    def ids(self) -> dict[str, str]:
        return {
            "session_id": self.session_id,
            "request_id": self.request_id,
            "key_id": self.key_id,
        }

    def secrets(self) -> tuple[str, ...]:
        return (self.session_id, self.request_id, self.key_id, self.marker)


@dataclass
class Probes:
    document: dict[str, Any]
    client: httpx.AsyncClient
    victim: Victim
    stack: Stack
    leaks: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)

    def operations(self) -> list[Operation]:
        return operations(self.document)

    def body(self, operation: Operation) -> Any:
        if operation.body_schema is None:
            return None
        return least_body(self.document, operation.body_schema)

    async def send(
        self,
        kind: str,
        operation: Operation,
        headers: dict[str, str],
        *,
        content: bytes | None = None,
    ) -> httpx.Response:
        """One probe; event streams are only opened, their status read."""
        self.sent[kind] += 1
        url = operation.url(self.victim.ids)
        if content is None and operation.body_schema is not None:
            content = json.dumps(self.body(operation)).encode()
        sent_headers = {**headers, "Content-Type": "application/json"} if content else headers
        request = self.client.build_request(
            operation.method.upper(), url, headers=sent_headers, content=content
        )
        response = await self.client.send(request, stream=True)
        try:
            if not operation.event_stream or response.status_code != 200:
                await response.aread()
        finally:
            await response.aclose()
        return response

    def leak(self, kind: str, operation: Operation, response: httpx.Response, why: str) -> None:
        self.leaks[kind] += 1
        self.findings.append(f"{kind}: {operation} -> {response.status_code} ({why})")

    def reveals(self, response: httpx.Response) -> str | None:
        """A secret of the victim's in the answer that the request did not itself name."""
        body = response.content if response.is_stream_consumed else b""
        asked = str(response.request.url)
        return next(
            (s for s in self.victim.secrets() if s.encode() in body and s not in asked), None
        )


def _keys_of_a_stranger() -> list[tuple[str, dict[str, str]]]:
    """Credentials that must all be refused: malformed keys, a key that was never made, a
    token signed by a key nobody trusts, a credential in the wrong scheme."""
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode(
        {"sub": "eve", "tenant": "someone", "roles": ["admin"], "exp": 4_000_000_000},
        stranger,
        algorithm="RS256",
    )
    unsigned = jwt.encode({"sub": "eve", "tenant": "someone", "roles": ["admin"]}, None, "none")
    return [
        ("no key", {}),
        ("malformed key", {"Authorization": "Bearer hlk_"}),
        ("malformed key, long", {"Authorization": "Bearer hlk_" + "A" * 4000}),
        ("unknown key", {"Authorization": f"Bearer hlk_{uuid.uuid4().hex}_{uuid.uuid4().hex}"}),
        ("garbage", {"Authorization": "Bearer ' OR 1=1 --"}),
        ("basic scheme", {"Authorization": "Basic YWRtaW46YWRtaW4="}),
        ("forged token", {"Authorization": f"Bearer {forged}"}),
        ("unsigned token", {"Authorization": f"Bearer {unsigned}"}),
        ("X-API-Key malformed", {"X-API-Key": "hlk_nope"}),
    ]


@pytest.fixture(scope="module")
async def probes(stack: Stack) -> AsyncIterator[Probes]:
    tenant = f"t{uuid.uuid4().hex[:12]}"
    marker = f"victim-{uuid.uuid4().hex}"
    admin = await stack.key(tenant, "admin")
    viewer = await stack.key(tenant, "viewer")
    waiting = Playbook(
        goal=f"{marker}: a command waits for a person",
        steps=(PlanStep(id="wait", tool="run_command", arguments={"command": "true"}),),
    )
    session_id = await start_playbook(
        stack.store, tenant, waiting, Actor(id="ana", roles=("operator",))
    )

    async def waiting_on_a_person() -> SessionState | None:
        state = (await stack.store.load(tenant, session_id)).state
        return state if state.approvals else None

    state: SessionState = await eventually(
        waiting_on_a_person, timeout_s=60, what="the victim's approval request"
    )
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as client:

        async def known() -> bool:
            return (await client.get("/keys", headers=admin)).status_code == 200

        await eventually(known, timeout_s=10, what="the API to know the victim's keys")
        listed = (await client.get("/keys", headers=admin)).json()
        key_id = next(k["key_id"] for k in listed if k["name"].endswith("-admin"))
        document = (await client.get("/openapi.json")).json()
        victim = Victim(
            tenant, session_id, next(iter(state.approvals)), key_id, marker, admin, viewer
        )
        found = Probes(document, client, victim, stack)
        yield found
    figures.record(
        "api",
        operations=len(found.operations()),
        probes=sum(found.sent.values()),
        probes_by_kind=dict(found.sent),
        leaks=sum(found.leaks.values()),
        leaks_by_kind=dict(found.leaks),
    )


async def _victims_log(probes: Probes) -> int:
    return await probes.stack.store.last_seq(probes.victim.tenant, probes.victim.session_id)


def _secured(probes: Probes) -> list[Operation]:
    secured = [o for o in probes.operations() if o.secured]
    # The document is read right: sessions, approvals and keys are all there.
    paths = {o.path for o in secured}
    assert {"/sessions", "/sessions/{session_id}", "/keys"} <= paths, paths
    assert any("{request_id}" in p for p in paths), paths
    return secured


async def test_without_a_valid_credential_every_route_answers_401(probes: Probes) -> None:
    before = await _victims_log(probes)
    for operation in _secured(probes):
        for kind, headers in _keys_of_a_stranger():
            response = await probes.send(kind, operation, headers)
            if response.status_code != 401:
                probes.leak("credential", operation, response, f"{kind}: not 401")
    assert await _victims_log(probes) == before
    assert probes.leaks["credential"] == 0, probes.findings


async def test_another_tenants_admin_reaches_nothing_of_the_victims(
    probes: Probes, stack: Stack
) -> None:
    stranger = await stack.key(f"t{uuid.uuid4().hex[:12]}", "admin")
    await eventually(
        lambda: _accepted(probes.client, stranger), timeout_s=10, what="the stranger's key"
    )
    before = await _victims_log(probes)
    for operation in _secured(probes):
        response = await probes.send("other tenant", operation, stranger)
        names_victim = "{" in operation.path
        if response.status_code >= 500:
            probes.leak("other tenant", operation, response, "server error")
        elif names_victim and response.is_success:
            probes.leak("other tenant", operation, response, "granted on the victim's")
        elif (revealed := probes.reveals(response)) is not None:
            probes.leak("other tenant", operation, response, f"revealed {revealed}")
    assert await _victims_log(probes) == before
    assert probes.leaks["other tenant"] == 0, probes.findings


async def test_a_viewer_can_write_nothing(probes: Probes) -> None:
    before = await _victims_log(probes)
    writes = [o for o in _secured(probes) if o.writes]
    assert len(writes) >= 5, writes
    for operation in writes:
        response = await probes.send("viewer write", operation, probes.victim.viewer)
        if response.status_code != 403:
            probes.leak("viewer write", operation, response, "not 403")
    assert await _victims_log(probes) == before
    assert probes.leaks["viewer write"] == 0, probes.findings


async def _accepted(client: httpx.AsyncClient, headers: dict[str, str]) -> bool:
    return (await client.get("/me", headers=headers)).status_code == 200


async def _declared_oversized(
    probes: Probes, kind: str, operation: Operation, headers: dict[str, str]
) -> int:
    """The status answered to a request that declares a body far past any limit and sends
    only its start: the server must answer without waiting for the rest, or reading it. (A
    client that sent it all would see the connection closed under it, not the answer.)"""
    probes.sent[kind] += 1
    api = httpx.URL(probes.stack.api_url)
    assert api.host
    assert api.port
    head = [
        f"{operation.method.upper()} {operation.url(probes.victim.ids)} HTTP/1.1",
        f"Host: {api.host}:{api.port}",
        "Content-Type: application/json",
        f"Content-Length: {OVERSIZED_BYTES}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    reader, writer = await asyncio.open_connection(api.host, api.port)
    try:
        writer.write("\r\n".join([*head, "", ""]).encode() + b'{"goal": "' + b"x" * 65536)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=30)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return int(status_line.split()[1])


async def _oversized(probes: Probes, kind: str) -> dict[str, int]:
    """Each operation that takes a body, sent one far too large by an admin of the victim's
    (a key of its own each time: a rotation accepted would end the one before)."""
    statuses = {}
    for operation in _secured(probes):
        if operation.body_schema is not None:
            admin = await probes.stack.key(probes.victim.tenant, "admin")
            await eventually(
                lambda admin=admin: _accepted(probes.client, admin),  # type: ignore[misc]
                timeout_s=10,
                what="a new admin key",
            )
            statuses[str(operation)] = await _declared_oversized(probes, kind, operation, admin)
    assert statuses
    return statuses


async def test_an_oversized_body_is_answered_413_and_never_taken_in(probes: Probes) -> None:
    statuses = await _oversized(probes, "oversized")
    probes.leaks["oversized: not 413"] = sum(s != 413 for s in statuses.values())
    figures.record("api", oversized_taken_in=sum(200 <= s < 300 for s in statuses.values()))
    assert probes.leaks["oversized: not 413"] == 0, statuses


async def test_resuming_the_event_stream_never_crosses_tenants(
    probes: Probes, stack: Stack
) -> None:
    """Another tenant resumes the tenant-wide stream from before the victim's first event,
    by header and by query, and asks for the victim's session's stream."""
    stranger_tenant = f"t{uuid.uuid4().hex[:12]}"
    stranger = await stack.key(stranger_tenant, "admin")
    await eventually(
        lambda: _accepted(probes.client, stranger), timeout_s=10, what="the stranger's key"
    )
    own = await start_playbook(
        stack.store,
        stranger_tenant,
        Playbook(
            goal="mine", steps=(PlanStep(id="say", tool="echo", arguments={"message": "hi"}),)
        ),
        Actor(id="eve", roles=("operator",)),
    )
    last = await stack.store.last_seq(stranger_tenant, own)
    streams = [
        await sse_until(probes.client, "/events?after=0", stranger, last),
        await sse_until(probes.client, "/events", {**stranger, "Last-Event-ID": "0"}, last),
    ]
    probes.sent["sse resume"] += 3
    for stream in streams:
        assert own.encode() in stream
        revealed = [s for s in probes.victim.secrets() if s.encode() in stream]
        if revealed:
            probes.leaks["sse resume"] += 1
            probes.findings.append(f"sse resume revealed {revealed}")
    response = await probes.client.get(
        f"/sessions/{probes.victim.session_id}/events",
        headers={**stranger, "Last-Event-ID": "0"},
    )
    if response.status_code != 404:
        probes.leaks["sse resume"] += 1
        probes.findings.append(f"victim's session stream: {response.status_code}")
    assert probes.leaks["sse resume"] == 0, probes.findings
