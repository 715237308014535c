"""The floor under step latency: a ring of three bare processes passing a token through
JetStream, each hop one durable push delivery and one acknowledged append, with no
Helmline code on the path. Helmline's step is three such hops, so the ring's lap time on
the same machine, in the same run, is what a step can at best cost here.

Laps that start after the ring sat idle for as long as the approval bench's person thinks
are the floor under the approval round trip, also three hops: processes that slept wake
much more slowly than busy ones (on this kind of machine, about three times).

It runs durable (every append fsynced before its acknowledgement) and, in `make bench`,
relaxed too, so that each mode's figures have the floor of their own mode beside them.

Run as `python ring.py HOP URL` it is one process of the ring.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
import uvloop
from approval import PERSON_DELAY_S
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from helmline.runtime import Durability
from helmline.runtime.testing import NatsServer

HOPS = 3
APPENDS = 1000
LAPS = 300
IDLE_LAPS = 60
STREAM = "RING"


def _subject(hop: int) -> str:
    return f"ring.{hop % HOPS}"


async def _hop(hop: int, url: str) -> None:
    """Forward every token arriving at this hop to the next one, then acknowledge it."""
    nc = await nats.connect(url)
    js = nc.jetstream()

    async def forward(message: Msg) -> None:
        await js.publish(_subject(hop + 1), message.data)
        await message.ack()

    deliver = f"_ring.deliver.{hop}"
    await js.add_consumer(
        STREAM,
        ConsumerConfig(
            durable_name=f"hop{hop}",
            deliver_subject=deliver,
            ack_policy=AckPolicy.EXPLICIT,
            filter_subject=_subject(hop),
        ),
    )
    await nc.subscribe(deliver, cb=forward)
    print("ready", flush=True)
    await asyncio.Event().wait()


async def run(durability: Durability = "durable") -> list[dict[str, Any]]:
    with (
        tempfile.TemporaryDirectory() as folder,
        NatsServer(Path(folder), durability=durability) as server,
    ):
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=["ring.*"]))
        # One acknowledged append alone, on a subject no hop consumes: what each hop pays
        # for the store (and, durable, the fsync) before it can pass the token on.
        appends = []
        for _ in range(APPENDS):
            began = time.perf_counter()
            await js.publish("ring.alone", b"token")
            appends.append((time.perf_counter() - began) * 1000)
        # Hops 1 and 2 are processes of their own; this process is hop 0 and times laps.
        hops = [
            await asyncio.create_subprocess_exec(
                sys.executable, __file__, str(hop), server.url, stdout=asyncio.subprocess.PIPE
            )
            for hop in (1, 2)
        ]
        try:
            for process in hops:
                assert process.stdout is not None
                await process.stdout.readline()
            arrived: asyncio.Queue[float] = asyncio.Queue()

            async def returned(message: Msg) -> None:
                await message.ack()
                arrived.put_nowait(time.perf_counter())

            async def lap() -> float:
                began = time.perf_counter()
                await js.publish(_subject(1), b"token")
                return (await asyncio.wait_for(arrived.get(), timeout=10) - began) * 1000

            await js.subscribe(_subject(0), cb=returned, durable="hop0", manual_ack=True)
            laps = [await lap() for _ in range(LAPS)]
            after_idle: list[float] = []
            for _ in range(IDLE_LAPS):
                await asyncio.sleep(PERSON_DELAY_S)
                after_idle.append(await lap())
        finally:
            for process in hops:
                process.kill()
                await process.wait()
            await nc.close()
    laps = laps[LAPS // 10 :]  # Connections and consumers warm up in the first laps.
    appends = appends[APPENDS // 10 :]
    return [
        {
            "figure": "append_ms",
            "appends": len(appends),
            "p50": round(statistics.median(appends), 3),
            "p99": round(sorted(appends)[int(0.99 * len(appends))], 3),
            "target": "baseline: one acknowledged append, one publisher, nothing else running",
        },
        {
            "figure": "ring_of_three_lap_ms",
            "laps": len(laps),
            "p50": round(statistics.median(laps), 3),
            "p99": round(sorted(laps)[int(0.99 * len(laps))], 3),
            "target": "baseline: the least a three-hop step can cost on this machine now",
        },
        {
            "figure": "ring_of_three_lap_after_idle_ms",
            "laps": len(after_idle),
            "idle_ms": PERSON_DELAY_S * 1000,
            "p50": round(statistics.median(after_idle), 3),
            "p99": round(sorted(after_idle)[int(0.99 * len(after_idle))], 3),
            "target": "baseline: the least the approval round trip (three hops from idle) can "
            "cost on this machine now",
        },
    ]


if __name__ == "__main__":
    uvloop.run(_hop(int(sys.argv[1]), sys.argv[2]))  # The services' event loop.
