"""The example subscriber gets exactly the filtered events, and resumes after a restart."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from helmline.contracts import (
    Event,
    ToolCallCompleted,
    ToolCallStarted,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import session_started

SUBSCRIBER = Path(__file__).resolve().parents[2] / "examples" / "subscriber" / "subscriber.py"


async def run_subscriber(nats_url: str, tenant: str, stop_after: int) -> list[dict[str, object]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SUBSCRIBER),
        "--nats-url",
        nats_url,
        "--tenant",
        tenant,
        "--durable",
        f"audit-{tenant}",
        "--stop-after",
        str(stop_after),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0
    return [json.loads(line) for line in out.decode().splitlines()]


def _calls(root: Event, first: int, count: int) -> list[Event]:
    events = []
    for i in range(first, first + count):
        call = {"call_id": f"c{i}", "step_id": f"s{i}", "tool": "echo"}
        events.append(root.derive(ToolCallStarted(**call), source="test", key=str(i)))
        events.append(root.derive(ToolCallCompleted(**call), source="test", key=str(i)))
    return events


async def test_exactly_the_filtered_events_then_resume_after_restart(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    root = session_started(tenant, "s1")
    other_tenant = session_started(f"{tenant}x", "s1")
    await store.append_all([root, *_calls(root, 0, 3)])
    await store.append_all([other_tenant, *_calls(other_tenant, 0, 2)])

    first = await run_subscriber(nats_url, tenant, stop_after=5)
    assert [(line["type"], line["call"]) for line in first] == [
        (kind, f"c{i}") for i in range(3) for kind in ("tool.call.started", "tool.call.completed")
    ][:5]

    await store.append_all(_calls(root, 3, 2))
    second = await run_subscriber(nats_url, tenant, stop_after=5)
    assert [line["call"] for line in second] == ["c2", "c3", "c3", "c4", "c4"]
    assert int(str(second[0]["seq"])) > int(str(first[-1]["seq"]))
