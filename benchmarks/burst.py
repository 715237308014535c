"""A burst: 1,000 sessions started at once on services that each run as their own process.

Every session must complete; the figures are the time until the last one has, each
service's peak memory meanwhile, and the largest backlog each consumer had (messages
waiting to be delivered or acknowledged), sampled while the burst drains.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psutil
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from steps import echo_chain, run_sessions, services_running

from helmline.contracts import SERVICE_CONSUMERS
from helmline.runtime.testing import ServiceProcesses

BURST = 1_000
STEPS_EACH = 3
SAMPLE_S = 0.2
"""How often memory and backlogs are sampled while the burst drains."""


class Peaks:
    """The largest resident memory of each service process and backlog of each consumer."""

    def __init__(self, services: ServiceProcesses, js: JetStreamContext) -> None:
        self._processes = {
            name: psutil.Process(process.pid) for name, process in services.processes.items()
        }
        self._js = js
        self.rss_mib: dict[str, float] = dict.fromkeys(self._processes, 0.0)
        self.backlog: dict[str, int] = {}

    async def sample_until_cancelled(self) -> None:
        while True:
            for name, process in self._processes.items():
                with contextlib.suppress(psutil.NoSuchProcess):
                    rss = process.memory_info().rss / 2**20
                    self.rss_mib[name] = max(self.rss_mib[name], rss)
            for spec in SERVICE_CONSUMERS:
                try:
                    info = await self._js.consumer_info(spec.stream, spec.durable)
                except NotFoundError:
                    continue  # The read model's: the state service runs without PostgreSQL.
                waiting = (info.num_pending or 0) + (info.num_ack_pending or 0)
                self.backlog[spec.durable] = max(self.backlog.get(spec.durable, 0), waiting)
            await asyncio.sleep(SAMPLE_S)  # A sampling period: there is nothing to wait on.


async def run() -> list[dict[str, Any]]:
    async with services_running() as (nc, store, services):
        peaks = Peaks(services, nc.jetstream())
        sampling = asyncio.create_task(peaks.sample_until_cancelled())
        try:
            _, seconds = await run_sessions(nc, store, "burst", [echo_chain(STEPS_EACH)] * BURST)
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
    return [
        {
            "figure": "burst_drain_s",
            "value": round(seconds, 2),
            "sessions": BURST,
            "steps_each": STEPS_EACH,
            "steps_per_s": round(BURST * STEPS_EACH / seconds, 1),
        },
        {
            "figure": "burst_peak_rss_mib",
            "value": round(max(peaks.rss_mib.values()), 1),
            "by_service": {name: round(rss, 1) for name, rss in peaks.rss_mib.items()},
            "target": "each service <= 150 MiB idle (DESIGN.md); a burst's peak for reference",
        },
        {
            "figure": "burst_largest_backlog_messages",
            "value": max(peaks.backlog.values()),
            "by_consumer": peaks.backlog,
        },
    ]
