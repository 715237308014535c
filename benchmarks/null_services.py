"""The approval round trip through services that decide nothing: the floor that Helmline's
runtime alone sets under it on this machine.

Three processes stand for the approval service, the tool gateway and the sandbox. Each runs
the runtime as its service does (`run_service`: the host, a durable consumer, the event
store; the sandbox's on asyncio's loop) with a handler that only derives the event the next
one consumes and appends it. The bench appends a person's decision after as long an idle
time as the approval bench's person takes, and times it to the `tool.call.started` the last
one records, both times as the events record them, as the approval bench does.

So, within one run: what this takes beyond the ring's laps after idle is the runtime's
(taking a delivery in order, decoding it, deriving, encoding and appending an event); what
the approval round trip takes beyond this is the services' own deciding.

Run as `python null_services.py HOP` it is one of the three (its environment names the NATS
server, as a service's does).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
from approval import APPROVER, PERSON_DELAY_S, ROUND_TRIPS, percentile
from nats.aio.msg import Msg

from helmline.contracts import (
    EVENTS_STREAM,
    ApprovalDecisionSubmitted,
    ConsumerSpec,
    Event,
    Payload,
    SandboxExecutionRequested,
    ToolCallAuthorized,
    ToolCallStarted,
    decode_event,
    event_type_filter,
    new_event,
    new_trace,
)
from helmline.runtime import Delivery, EventStore, RuntimeSettings, ServiceHost, run_service
from helmline.runtime.testing import NatsServer, ServiceProcesses

SCRIPT = Path(__file__).resolve()
HOP_VARIABLE = "HELMLINE_BENCH_NULL_HOP"
WARM_UP = 5
CALL = {"call_id": "call-1", "step_id": "ls", "tool": "list_files"}

Hop = tuple[type[Payload], Callable[[], Payload], bool]
HOPS: dict[str, Hop] = {
    # What each consumes, what it appends, and whether it runs on asyncio's loop.
    "approval": (
        ApprovalDecisionSubmitted,
        lambda: ToolCallAuthorized(**CALL, risk="low"),
        False,
    ),
    "tool_gateway": (ToolCallAuthorized, lambda: SandboxExecutionRequested(**CALL), False),
    "sandbox": (SandboxExecutionRequested, lambda: ToolCallStarted(**CALL), True),
}


def serve(hop: str) -> None:
    """Run one null service until SIGTERM."""
    consumed, next_payload, on_asyncio = HOPS[hop]
    spec = ConsumerSpec(
        durable=f"bench-null-{hop}",
        stream=EVENTS_STREAM.name,
        filter_subjects=(event_type_filter(consumed.TYPE),),
        description=f"stands for the {hop} service, deciding nothing",
    )

    async def setup(host: ServiceHost) -> None:
        store = host.store

        async def forward(delivery: Delivery) -> None:
            await store.append(delivery.event.derive(next_payload(), source=f"bench/{hop}"))

        await host.consume(spec, forward)

    run_service(
        f"null-{hop}", RuntimeSettings(), setup, event_loop="asyncio" if on_asyncio else "uvloop"
    )


async def round_trips(folder: Path, count: int) -> list[float]:
    """Decisions one after another, each in a session of its own, after an idle time."""
    with NatsServer(folder) as server:
        services = ServiceProcesses(server.url, folder)
        try:
            for hop in HOPS:
                await asyncio.to_thread(services.start, hop, {HOP_VARIABLE: hop}, SCRIPT)
            nc = await nats.connect(server.url)
            store = EventStore(nc.jetstream())
            started: asyncio.Queue[Event] = asyncio.Queue()

            async def on_started(message: Msg) -> None:
                started.put_nowait(decode_event(message.data))

            await nc.subscribe(event_type_filter(ToolCallStarted.TYPE), cb=on_started)
            vote = ApprovalDecisionSubmitted(
                request_id="ask-1", decision="grant", decided_by=APPROVER
            )
            gaps_ms: list[float] = []
            for index in range(count + WARM_UP):
                # The idle time is what is measured against, as the approval bench's
                # person waits: there is nothing to wait for instead.
                await asyncio.sleep(PERSON_DELAY_S)
                # The real approval service knows the session's trace from the request the
                # decision answers; here the decision carries one, so that none is read.
                decided = new_event(
                    vote,
                    tenant="null",
                    session_id=uuid.uuid4().hex,
                    source="bench",
                    traceparent=new_trace(),
                )
                await store.append(decided)
                began = await asyncio.wait_for(started.get(), timeout=60)
                assert began.session_id == decided.session_id
                if index >= WARM_UP:
                    gaps_ms.append((began.time - decided.time).total_seconds() * 1000)
            await nc.close()
        finally:
            await asyncio.to_thread(services.stop_all)
    return gaps_ms


async def run() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        gaps_ms = await round_trips(Path(folder), ROUND_TRIPS)
    return [
        {
            "figure": "approval_round_trip_null_services_ms",
            "approvals": len(gaps_ms),
            "p50": round(statistics.median(gaps_ms), 3),
            "p99": round(percentile(gaps_ms, 0.99), 3),
            "target": "baseline: the least the approval round trip can cost with Helmline's "
            "runtime on this machine now (services that decide nothing)",
        }
    ]


if __name__ == "__main__":
    serve(os.environ.get(HOP_VARIABLE) or sys.argv[1])
