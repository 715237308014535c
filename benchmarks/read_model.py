"""Rebuild the read model from a 100,000-event log while queries keep being answered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
from replay import session_events

from helmline.cli._postgres import start_postgres, stop_postgres
from helmline.contracts import encode_event, event_subject
from helmline.runtime import EventStore, ensure_topology
from helmline.runtime.testing import NatsServer, free_port
from helmline.state import rebuild_read_model

SESSIONS = 1_000
EVENTS_PER_SESSION = 100
ROUNDS = 3
QUERY_PAUSE_S = 0.01


# The reader is a process of its own, as the API would be: in the rebuilding process its
# queries would measure that process's event loop, not PostgreSQL's answers.
READER = """
import asyncio, json, sys, time
import asyncpg

async def main(url, pause_s):
    connection = await asyncpg.connect(url)
    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    latencies = []
    while not stop.done():
        began = time.perf_counter()
        await connection.fetchval(
            "SELECT count(*) FROM sessions WHERE tenant = 'bench' AND status = 'executing'"
        )
        latencies.append((time.perf_counter() - began) * 1000)
        await asyncio.sleep(pause_s)
    print(json.dumps(latencies))

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


async def _rebuild_while_queried(
    store: EventStore, database_url: str
) -> tuple[Any, float, list[float]]:
    """The rebuild's report, the CPU seconds this process spent on it, and the milliseconds
    of each query answered meanwhile."""
    reader = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        READER,
        database_url,
        str(QUERY_PAUSE_S),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        began = time.process_time()
        report = await rebuild_read_model(store, database_url)
        cpu_s = time.process_time() - began
    finally:
        answers, _ = await reader.communicate(b"")
    return report, cpu_s, json.loads(answers)


@contextlib.asynccontextmanager
async def log_and_database(
    sessions: int, events_each: int, prefix: str
) -> AsyncIterator[tuple[NatsServer, EventStore, str]]:
    """A nats-server holding `sessions` sessions of `events_each` events (tenant `bench`,
    ids `<prefix><n>`) and a PostgreSQL with the read model's tables, empty: the server,
    the event store and the database's URL. Both are stopped when the block ends."""
    folder = Path(tempfile.mkdtemp(prefix="helmline-bench-pg-"))
    process, database_url = start_postgres(
        pgdata=folder / "pgdata", port=free_port(), log=folder / "postgres.log", timeout=30
    )
    try:
        (folder / "nats").mkdir()
        with NatsServer(folder / "nats") as server:
            connection = await nats.connect(server.url)
            js = connection.jetstream()
            await ensure_topology(js)
            store = EventStore(js, timeout_s=60)
            await rebuild_read_model(store, database_url)  # Of an empty log: makes the tables.
            for number in range(sessions):
                for event in session_events(events_each, session_id=f"{prefix}{number}"):
                    await js.publish_async(
                        event_subject(event.tenant, event.session_id, event.type),
                        encode_event(event),
                    )
            await js.publish_async_completed()
            try:
                yield server, store, database_url
            finally:
                await connection.close()
    finally:
        stop_postgres(pgdata=folder / "pgdata", process=process, grace=10)
        shutil.rmtree(folder, ignore_errors=True)


async def rebuild() -> list[dict[str, Any]]:
    async with log_and_database(SESSIONS, EVENTS_PER_SESSION, "r") as (_, store, database_url):
        rates, cpu_rates, latencies = [], [], []
        for _ in range(ROUNDS):
            report, cpu_s, answered = await _rebuild_while_queried(store, database_url)
            latencies += answered
            assert report.events == SESSIONS * EVENTS_PER_SESSION
            rates.append(report.events_per_s)
            cpu_rates.append(report.events / cpu_s)
    latencies.sort()
    return [
        {
            "figure": "read_model_rebuild_events_per_s",
            "events": SESSIONS * EVENTS_PER_SESSION,
            "sessions": SESSIONS,
            "value": round(statistics.median(rates)),
            "rounds": [round(rate) for rate in rates],
            # Per CPU second of the rebuilding process: what the machine's load does not
            # change (PostgreSQL and nats-server work on the other core).
            "rebuild_events_per_cpu_s": round(statistics.median(cpu_rates)),
            "queries_answered_during": len(latencies),
            "query_p50_ms": round(latencies[len(latencies) // 2], 2),
            "query_max_ms": round(latencies[-1], 2),
            "target": ">= 20000 events/s, queries answered throughout",
        }
    ]
