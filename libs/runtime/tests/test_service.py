"""The service lifecycle: health, SIGTERM, in-flight work finished before draining."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx
from nats.js import JetStreamContext

from helmline.contracts import (
    EVENTS_STREAM,
    Actor,
    ConsumerSpec,
    SessionStarted,
    new_event,
    tenant_filter,
)
from helmline.runtime import Delivery, EventStore, RuntimeSettings, ServiceHost
from helmline.runtime.testing import eventually, free_port


async def test_a_service_process_reports_ready_and_stops_on_sigterm(nats_url: str) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "helmline.planner",
        env={**os.environ, "HELMLINE_NATS_URL": nats_url, "HELMLINE_HEALTH_PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def ready() -> bool:
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout_s=20, what="planner ready")
            assert (await client.get("/healthz")).json()["service"] == "planner"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_shutdown_lets_in_flight_work_finish_and_acks_it(
    nats_url: str, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    spec = ConsumerSpec(
        durable=f"test-{tenant}",
        stream=EVENTS_STREAM.name,
        filter_subjects=(tenant_filter(tenant),),
        description="slow consumer",
    )
    started_handling = asyncio.Event()
    finished: list[Delivery] = []

    async def slow(delivery: Delivery) -> None:
        started_handling.set()
        await asyncio.sleep(0.3)  # Stands for a tool call in progress.
        finished.append(delivery)

    settings = RuntimeSettings(nats_url=nats_url, shutdown_grace_s=5)
    async with ServiceHost("test", settings) as host:
        await host.consume(spec, slow)
        await store.append(
            new_event(
                SessionStarted(goal="g", requested_by=Actor(id="a")),
                tenant=tenant,
                session_id="s1",
                source="test",
            )
        )
        await asyncio.wait_for(started_handling.wait(), timeout=10)
        host.request_stop()
        await host.shutdown()
        await host.shutdown()  # Idempotent.
    assert len(finished) == 1

    info = await js.consumer_info(EVENTS_STREAM.name, spec.durable)
    assert info.num_ack_pending == 0
    assert info.num_pending == 0
