"""SSE fan-out: 200 clients follow one busy session through the API (its own process); the
delay is from just before an event is appended to the moment a client has read its frame.

On a shared machine the delay mostly measures how long the API waits for a core, so the
API's CPU time per delivered frame is reported beside it."""

from __future__ import annotations

import asyncio
import re
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from steps import api_alone

from helmline.contracts import Actor, SessionStarted, ThoughtRecorded, new_event
from helmline.runtime.testing import free_port

CLIENTS = 200
EVENTS = 300
RATE_PER_S = 50
TENANT = "bench"
FRAME_ID = re.compile(rb"(?:^|\n)id: (\d+)\n")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def follower(
    port: int, path: str, key: str, ready: asyncio.Event, expected: int
) -> list[tuple[int, float]]:
    """One client on a raw socket, noting when each event's frame arrived (by its SSE id,
    the stream sequence): the client does as little as it can, so that its own lag does not
    count as the API's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # Status line and headers.
    ready.set()
    arrivals: list[tuple[int, float]] = []
    pending = b""
    while len(arrivals) < expected:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        now = time.perf_counter()
        complete, _, pending = (pending + chunk).rpartition(b"\n\n")
        arrivals.extend((int(seq), now) for seq in FRAME_ID.findall(complete))
    writer.close()
    return arrivals


async def fan_out(folder: Path) -> dict[str, Any]:
    port = free_port()
    async with api_alone(folder, port, TENANT, "viewer") as (_, store, services, key):
        session_id = uuid.uuid4().hex
        actor = Actor(id="bench")
        started = SessionStarted(goal="busy", requested_by=actor, mode="plan")
        await store.append(new_event(started, tenant=TENANT, session_id=session_id, source="bench"))
        appended: dict[int, float] = {}
        readies = [asyncio.Event() for _ in range(CLIENTS)]
        after = await store.last_seq(TENANT, session_id)
        path = f"/sessions/{session_id}/events?after={after}"
        clients = [
            asyncio.create_task(follower(port, path, key, ready, EVENTS)) for ready in readies
        ]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=60)
        await asyncio.sleep(1)  # Every follower has joined the live feed by now.
        api = psutil.Process(services.processes["api"].pid)
        cpu_before = sum(api.cpu_times()[:2])
        began = time.perf_counter()
        for index in range(EVENTS):
            thought = ThoughtRecorded(kind="reasoning", text=f"thinking {index} " + "x" * 200)
            event = new_event(thought, tenant=TENANT, session_id=session_id, source="bench")
            before = time.perf_counter()
            appended[(await store.append(event)).seq] = before
            pause = began + (index + 1) / RATE_PER_S - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
        arrivals = await asyncio.wait_for(asyncio.gather(*clients), timeout=120)
        api_cpu_s = sum(api.cpu_times()[:2]) - cpu_before
    delays = [(at - appended[seq]) * 1000 for each in arrivals for seq, at in each]
    return {
        "figure": "sse_fanout_delay_ms",
        "clients": CLIENTS,
        "events": EVENTS,
        "rate_per_s": RATE_PER_S,
        "deliveries": len(delays),
        "clients_complete": sum(1 for each in arrivals if len(each) == EVENTS),
        "p50": round(statistics.median(delays), 2),
        "p99": round(percentile(delays, 0.99), 2),
        "max": round(max(delays), 2),
        "target": "p99 <= 50 ms",
        # Independent of how busy the shared machine is: the API's own work per delivery.
        "api_cpu_us_per_delivery": round(api_cpu_s / max(1, len(delays)) * 1e6, 1),
    }


async def run() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        return [await fan_out(Path(folder))]
