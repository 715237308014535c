"""Step latency and throughput with every service in its own process.

A step is one tool call scheduled, authorised, executed and recorded, up to the next step
being scheduled; checkpoints are made off that path. Latency is measured in 200-step
sequential echo playbooks (`SEQUENTIAL_SESSIONS` of them, pooled), throughput with 50
concurrent sessions of 20 steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import psutil
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from helmline.api import new_api_key, store_api_key
from helmline.contracts import (
    Actor,
    PlanStep,
    Playbook,
    SessionStarted,
    StepScheduled,
    event_type_filter,
    new_event,
    parse_event_subject,
)
from helmline.runtime import Durability, EventStore, ensure_topology
from helmline.runtime.testing import NatsServer, ServiceProcesses

SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
SEQUENTIAL_STEPS = 200
SEQUENTIAL_SESSIONS = 5
"""Sessions of `SEQUENTIAL_STEPS` run one after another, their steps' latencies pooled: the
p99 of one session's 199 steps is its second slowest step, decided by whichever single
pause (a collection, the host taking the processor) hit it; of 995 it is the tenth."""
SESSIONS, STEPS_EACH = 50, 20


def echo_chain(steps: int) -> Playbook:
    """A playbook of `steps` echo calls, each depending on the one before."""
    return Playbook(
        goal=f"{steps} echoes",
        steps=tuple(
            PlanStep(
                id=f"s{i}",
                tool="echo",
                arguments={"message": f"step {i}"},
                depends_on=(f"s{i - 1}",) if i else (),
            )
            for i in range(steps)
        ),
    )


async def run_sessions(
    nc: NATS, store: EventStore, tenant: str, playbooks: list[Playbook]
) -> tuple[list[str], float]:
    """Start the sessions at once; return their ids and seconds until the last one ended."""
    ended: set[str] = set()
    all_ended = asyncio.Event()

    async def on_end(message: Msg) -> None:
        ended.add(parse_event_subject(message.subject).session_id)
        if len(ended) == len(playbooks):
            all_ended.set()

    subscriptions = [
        await nc.subscribe(event_type_filter(kind, tenant), cb=on_end)
        for kind in ("session.completed", "session.failed")
    ]
    session_ids = [uuid.uuid4().hex for _ in playbooks]
    began = time.perf_counter()
    await asyncio.gather(
        *(
            store.append(
                new_event(
                    SessionStarted(
                        goal=playbook.goal, playbook=playbook, requested_by=Actor(id="bench")
                    ),
                    tenant=tenant,
                    session_id=session_id,
                    source="bench",
                )
            )
            for session_id, playbook in zip(session_ids, playbooks, strict=True)
        )
    )
    await asyncio.wait_for(all_ended.wait(), timeout=600)
    elapsed = time.perf_counter() - began
    for subscription in subscriptions:
        await subscription.unsubscribe()
    return session_ids, elapsed


@contextlib.asynccontextmanager
async def services_running(
    durability: Durability = "durable",
) -> AsyncIterator[tuple[NATS, EventStore, ServiceProcesses]]:
    """A nats-server of its own and every service as its own process on it; a connection
    and the event store. Everything is stopped when the block ends."""
    with (
        tempfile.TemporaryDirectory() as folder,
        NatsServer(Path(folder), durability=durability) as server,
    ):
        services = ServiceProcesses(server.url, Path(folder))
        try:
            for name in SERVICES:
                await asyncio.to_thread(services.start, name)
            nc = await nats.connect(server.url)
            await ensure_topology(nc.jetstream())
            yield nc, EventStore(nc.jetstream()), services
            await nc.close()
        finally:
            await asyncio.to_thread(services.stop_all)


@contextlib.asynccontextmanager
async def api_alone(
    folder: Path, port: int, tenant: str, role: str
) -> AsyncIterator[tuple[NATS, EventStore, ServiceProcesses, str]]:
    """A nats-server of its own with only the API service on it, on `port`; a connection,
    the event store, the processes and an API key of `tenant` with `role`. Everything is
    stopped when the block ends."""
    with NatsServer(folder) as server:
        services = ServiceProcesses(server.url, folder)
        os.environ["HELMLINE_API_PORT"] = str(port)
        try:
            await asyncio.to_thread(services.start, "api")
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await ensure_topology(js)
            key, record = new_api_key(tenant, (role,), name="bench")
            await store_api_key(js, record, by=Actor(id="bench"))
            yield nc, EventStore(js), services, key
            await nc.close()
        finally:
            os.environ.pop("HELMLINE_API_PORT", None)
            await asyncio.to_thread(services.stop_all)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def processor_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """Processor time (user and system) each process has used so far."""
    return {name: sum(process.cpu_times()[:2]) for name, process in processes.items()}


def stack_processes(services: ServiceProcesses) -> dict[str, psutil.Process]:
    """The stack's processes by name: each service's, and the nats-server this process
    started."""
    server = next(p for p in psutil.Process().children() if p.name() == "nats-server")
    return {
        **{name: psutil.Process(process.pid) for name, process in services.processes.items()},
        "nats-server": server,
    }


async def run(durability: Durability = "durable") -> list[dict[str, Any]]:
    async with services_running(durability) as (nc, store, services):
        await run_sessions(nc, store, "warmup", [echo_chain(5)])

        gaps_ms: list[float] = []
        for _ in range(SEQUENTIAL_SESSIONS):
            (session_id,), _ = await run_sessions(
                nc, store, "sequential", [echo_chain(SEQUENTIAL_STEPS)]
            )
            log = await store.read_all("sequential", session_id)
            scheduled = [s.event.time for s in log if isinstance(s.event.data, StepScheduled)]
            gaps_ms += [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(scheduled)]

        processes = stack_processes(services)
        before = processor_seconds(processes)
        _, elapsed = await run_sessions(
            nc, store, "concurrent", [echo_chain(STEPS_EACH) for _ in range(SESSIONS)]
        )
        after = processor_seconds(processes)
    steps = SESSIONS * STEPS_EACH
    cpu_us = {name: round((after[name] - before[name]) / steps * 1e6) for name in processes}
    return [
        {
            "figure": "step_latency_ms",
            "sessions": SEQUENTIAL_SESSIONS,
            "steps": len(gaps_ms),
            "p50": round(statistics.median(gaps_ms), 3),
            "p99": round(percentile(gaps_ms, 0.99), 3),
            "target": "durable: p50 <= 1 ring lap, p99 <= 3 laps (ring of the same durability)",
        },
        {
            "figure": "steps_per_s",
            "sessions": SESSIONS,
            "steps_each": STEPS_EACH,
            "value": round(SESSIONS * STEPS_EACH / elapsed),
            "target": "durable: >= 2,000 steps/s",
        },
        {
            # Robust where wall time is not: a busy machine slows a step, but hardly changes
            # the work it costs. Two cores give 2,000,000 us of processor a second, so the
            # total bounds the throughput these processes can reach here.
            "figure": "step_cpu_us",
            "sessions": SESSIONS,
            "steps_each": STEPS_EACH,
            "total": sum(cpu_us.values()),
            "by_process": cpu_us,
            "target": "none: what a step costs each process, to choose what to make cheaper",
        },
    ]
