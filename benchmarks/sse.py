"""SSE fan-out: 200 clients follow one busy session through the API (its own process); the
delay is from just before an event is appended to the moment a client has read its frame."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nats

from helmline.api import new_api_key, store_api_key
from helmline.contracts import Actor, SessionStarted, ThoughtRecorded, new_event
from helmline.runtime import EventStore, ensure_topology
from helmline.runtime.testing import NatsServer, ServiceProcesses, free_port

CLIENTS = 200
EVENTS = 300
RATE_PER_S = 50
TENANT = "bench"
EVENT_ID = re.compile(rb'"id":"([0-9a-f-]{36})"')


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def follower(
    port: int,
    path: str,
    key: str,
    appended: dict[bytes, float],
    delays: list[float],
    ready: asyncio.Event,
    count: list[int],
    expected: int,
) -> None:
    """One client, on a raw socket so that the client side costs as little as it can."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # Status line and headers.
    ready.set()
    received = 0
    while received < expected:
        chunk = await reader.readuntil(b"\n\n")
        now = time.perf_counter()
        match = EVENT_ID.search(chunk)
        if match is None:
            continue  # A comment or the chunk-size line of the transfer encoding.
        received += 1
        began = appended.get(match.group(1))
        if began is not None:
            delays.append((now - began) * 1000)
    count[0] += 1
    writer.close()


async def fan_out(folder: Path) -> dict[str, Any]:
    port = free_port()
    with NatsServer(folder) as server:
        services = ServiceProcesses(server.url, folder)
        os.environ["HELMLINE_API_PORT"] = str(port)
        try:
            await asyncio.to_thread(services.start, "api")
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await ensure_topology(js)
            store = EventStore(js)
            key, record = new_api_key(TENANT, ("viewer",), name="bench")
            await store_api_key(js, record)
            session_id = uuid.uuid4().hex
            actor = Actor(id="bench")
            started = SessionStarted(goal="busy", requested_by=actor, mode="plan")
            await store.append(
                new_event(started, tenant=TENANT, session_id=session_id, source="bench")
            )
            appended: dict[bytes, float] = {}
            delays: list[float] = []
            finished = [0]
            readies = [asyncio.Event() for _ in range(CLIENTS)]
            path = f"/sessions/{session_id}/events?after=1"
            clients = [
                asyncio.create_task(
                    follower(port, path, key, appended, delays, ready, finished, EVENTS)
                )
                for ready in readies
            ]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=60)
            await asyncio.sleep(1)  # Every ordered consumer is subscribed by now.
            began = time.perf_counter()
            for index in range(EVENTS):
                thought = ThoughtRecorded(kind="reasoning", text=f"thinking {index} " + "x" * 200)
                event = new_event(thought, tenant=TENANT, session_id=session_id, source="bench")
                appended[str(event.id).encode()] = time.perf_counter()
                await store.append(event)
                pause = began + (index + 1) / RATE_PER_S - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
            await asyncio.wait_for(asyncio.gather(*clients), timeout=120)
            await nc.close()
        finally:
            os.environ.pop("HELMLINE_API_PORT", None)
            await asyncio.to_thread(services.stop_all)
    return {
        "figure": "sse_fanout_delay_ms",
        "clients": CLIENTS,
        "events": EVENTS,
        "rate_per_s": RATE_PER_S,
        "deliveries": len(delays),
        "clients_complete": finished[0],
        "p50": round(statistics.median(delays), 2),
        "p99": round(percentile(delays, 0.99), 2),
        "max": round(max(delays), 2),
        "target": "p99 <= 50 ms",
    }


async def run() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        return [await fan_out(Path(folder))]
