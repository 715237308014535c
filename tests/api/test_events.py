"""Server-sent events: ids are stream sequences, and Last-Event-ID resumes exactly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from helmline.contracts import ThoughtRecorded
from helmline.runtime import EventStore
from helmline.runtime.testing import checkpointed
from tests.api.conftest import KeyMaker
from tests.api.test_api import start, until, waiting_request


@dataclass(frozen=True)
class Frame:
    id: int
    event: str
    data: str


@asynccontextmanager
async def follow(
    client: httpx.AsyncClient, url: str, headers: dict[str, str]
) -> AsyncIterator[asyncio.Queue[Frame]]:
    """The stream's frames in a queue, read in the background while the block runs."""
    frames: asyncio.Queue[Frame] = asyncio.Queue()
    opened = asyncio.Event()

    async def read() -> None:
        async with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            fields: dict[str, str] = {}
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    opened.set()
                elif line:
                    name, _, value = line.partition(": ")
                    fields[name] = value
                elif fields:
                    frames.put_nowait(Frame(int(fields["id"]), fields["event"], fields["data"]))
                    fields = {}

    reader = asyncio.create_task(read())
    await asyncio.wait_for(opened.wait(), timeout=10)
    try:
        yield frames
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def take(frames: asyncio.Queue[Frame], count: int) -> list[Frame]:
    return [await asyncio.wait_for(frames.get(), timeout=30) for _ in range(count)]


async def test_a_client_resuming_after_event_5_gets_6_to_n_exactly_once(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str, store: EventStore
) -> None:
    admin = await make_key(tenant, "admin")
    session_id = await start(client, admin)
    url = f"/sessions/{session_id}/events"
    async with follow(client, url, admin) as frames:
        first_five = await take(frames, 5)
    # While nobody listens, the session goes on: approved, it runs to its end.
    request_id = await waiting_request(client, admin, session_id)
    await client.post(
        f"/sessions/{session_id}/approvals/{request_id}", json={"decision": "grant"}, headers=admin
    )
    await until(client, admin, session_id, "completed")
    await checkpointed(store, tenant, session_id)
    log = await store.read_all(tenant, session_id)
    fifth = first_five[-1].id
    assert [f.id for f in first_five] == [s.seq for s in log[:5]]
    async with follow(client, url, {**admin, "Last-Event-ID": str(fifth)}) as frames:
        rest = await take(frames, len(log) - 5)
        # The stream keeps the log's order, so any duplicate would arrive before an event
        # appended now: the next frame must be that one.
        sentinel = await store.append(
            log[-1].event.derive(ThoughtRecorded(kind="reflection", text="done"), source="test")
        )
        (after_rest,) = await take(frames, 1)
        assert after_rest.id == sentinel.seq
    assert [f.id for f in rest] == [s.seq for s in log[5:]]
    assert [f.event for f in rest] == [s.event.type for s in log[5:]]
    assert all(f'"id":"{s.event.id}"' in f.data for f, s in zip(rest, log[5:], strict=True))


async def test_the_tenant_stream_carries_every_session_of_the_tenant_and_no_other(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    viewer = await make_key(tenant, "viewer")
    operator = await make_key(tenant, "operator")
    stranger = await make_key(f"{tenant}-b", "operator")
    async with follow(client, "/events", viewer) as frames:
        await start(client, stranger)
        mine = await start(client, operator)
        (started,) = await take(frames, 1)
        assert started.event == "session.started"
        assert f'"sessionid":"{mine}"' in started.data
