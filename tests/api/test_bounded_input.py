"""Bounded input on the HTTP API: a body past HELMLINE_API_MAX_BODY_BYTES is answered 413
as it arrives (declared too large, sent chunked with no length, or with a length that lies),
and no error quotes more than the first 200 bytes of a value."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from helmline.api._limits import BodyLimit, BodyTooLarge
from helmline.api._settings import ApiSettings
from tests.api.conftest import KeyMaker
from tests.api.test_api import assert_problem, start, waiting_request

LIMIT = ApiSettings().api_max_body_bytes
DEADLINE_S = 10.0


async def _raw(api_url: str, head: str, chunks: list[bytes]) -> tuple[int, dict[str, object]]:
    """Send a request's head and body chunks over a socket, never the end of the body; the
    status and problem the API answers with before the client would have sent it all."""
    address = urlsplit(api_url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(head.encode())
        for chunk in chunks:
            writer.write(chunk)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), DEADLINE_S)
        length = 0
        while (line := await asyncio.wait_for(reader.readline(), DEADLINE_S)) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        body = await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)
        return int(status_line.split()[1]), json.loads(body)
    finally:
        writer.close()
        await writer.wait_closed()


def _head(path: str, key: dict[str, str], framing: str) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: api\r\nAuthorization: {key['Authorization']}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    )


async def test_a_body_declared_too_large_is_refused_before_it_is_sent(
    api_url: str, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    status, problem = await _raw(
        api_url, _head("/sessions", operator, f"Content-Length: {LIMIT * 50}"), []
    )
    assert status == 413
    assert problem["title"] == "Content Too Large"
    assert f"larger than the {LIMIT} bytes" in str(problem["detail"])
    assert f"declared {LIMIT * 50} bytes" in str(problem["detail"])


async def test_a_chunked_body_is_cut_off_at_the_limit_and_quoted_by_its_first_200_bytes(
    api_url: str, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    start = b'{"goal": "' + b"A" * 190 + b"B" * 100
    body = start + b"C" * (LIMIT + 64 * 1024)
    pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    chunks = [f"{len(piece):x}\r\n".encode() + piece + b"\r\n" for piece in pieces]
    # The last chunk (`0\r\n\r\n`) is never sent: an API that read the body whole would
    # still be waiting for it at the deadline.
    status, problem = await _raw(
        api_url, _head("/sessions", operator, "Transfer-Encoding: chunked"), chunks
    )
    assert status == 413
    detail = str(problem["detail"])
    assert repr(start[:200].decode()) in detail  # 190 A and 10 B, not one B more
    assert "B" * 11 not in detail


async def test_a_length_that_lies_is_no_way_past_the_limit() -> None:
    """As a server that trusted the header would pass the body on: counted all the same."""
    reached: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            reached.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    pieces = [b"x" * 1024] * 3
    messages: list[Message] = [
        {"type": "http.request", "body": piece, "more_body": True} for piece in pieces
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "headers": [(b"content-length", b"10")]}
    # In the API, the problem handlers answer the error 413, as the chunked test shows.
    with pytest.raises(BodyTooLarge) as refused:
        await BodyLimit(app, max_bytes=2048)(scope, receive, send)
    assert refused.value.status_code == 413
    assert len(reached) == 2  # the third KiB never reached the app
    assert not sent


async def test_a_body_within_the_limit_is_taken(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    response = await client.post(
        "/sessions",
        json={"goal": "g", "labels": {"pad": "x" * (LIMIT // 2)}},
        headers=operator,
    )
    assert response.status_code == 201, response.text


async def test_a_validation_error_quotes_at_most_200_bytes_of_the_value(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    operator = await make_key(tenant, "operator")
    long_value = ["x" * 50] * 400  # 22 KB where a string is due
    playbook = {
        "goal": "g",
        "steps": [{"id": "a", "tool": "echo", "arguments": {"message": long_value}}],
    }
    response = await client.post("/sessions", json={"playbook": playbook}, headers=operator)
    assert_problem(response, 422, "is not of type 'string'", "more bytes")
    assert len(response.content) < 2000
    assert "x" * 200 not in response.text

    goal = "g" * 20_000  # past the goal's 10,000 characters
    response = await client.post("/sessions", json={"goal": goal}, headers=operator)
    assert_problem(response, 422, "body.goal")
    assert "g" * 201 not in response.text


async def test_an_argument_name_a_grant_names_is_quoted_by_its_first_200_bytes(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")
    playbook = {
        "goal": "g",
        "steps": [
            {"id": "a", "tool": "echo", "arguments": {"message": "hi"}, "requires_approval": True}
        ],
    }
    session_id = await start(client, admin, playbook)
    request_id = await waiting_request(client, admin, session_id)
    name = "n" * 5000
    decision = {
        "decision": "grant",
        "similar_limit": 2,
        "similar_where": {name: {"glob": "*"}},
    }
    response = await client.post(
        f"/sessions/{session_id}/approvals/{request_id}", json=decision, headers=admin
    )
    assert_problem(response, 422, "echo has no argument 'nnn", "(and 4800 more bytes)")
    assert "n" * 201 not in response.text

    unknown = "r" * 5000
    response = await client.post(
        f"/sessions/{session_id}/approvals/{unknown}", json={"decision": "deny"}, headers=admin
    )
    assert_problem(response, 404, "has no approval request rrr", "(4800 more bytes)")
    assert "r" * 201 not in response.text
