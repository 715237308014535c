"""Listing sessions with 10,000 of them in the log and the read model: the API's list (what
`GET /sessions` asks PostgreSQL) and `helmline sessions` (which folds the 100 started last
from the log)."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from read_model import log_and_database
from steps import percentile

from helmline.api._reads import SessionFilter, SessionLister
from helmline.state import rebuild_read_model

SESSIONS = 10_000
EVENTS_EACH = 7
"""A plan and one step each."""
API_LISTS = 50
CLI_LISTS = 5
HELMLINE = Path(sys.executable).parent / "helmline"


async def run() -> list[dict[str, Any]]:
    async with log_and_database(SESSIONS, EVENTS_EACH, "l") as (server, store, database_url):
        await rebuild_read_model(store, database_url)
        lister = SessionLister(store, database_url)
        api_ms = []
        for _ in range(API_LISTS):
            began = time.perf_counter()
            listed = await lister.sessions("bench", SessionFilter())
            api_ms.append((time.perf_counter() - began) * 1000)
        assert len(listed) == SessionFilter().limit
        await lister.close()
        cli_ms = [await _cli_list(server.url) for _ in range(CLI_LISTS)]
    return [
        {
            "figure": "api_list_sessions_ms",
            "sessions": SESSIONS,
            "p50": round(statistics.median(api_ms), 2),
            "p99": round(percentile(api_ms, 0.99), 2),
            "what": "the read-model query behind GET /sessions (the newest 100)",
        },
        {
            "figure": "cli_sessions_ms",
            "sessions": SESSIONS,
            "p50": round(statistics.median(cli_ms)),
            "max": round(max(cli_ms)),
            "what": "`helmline sessions`, a whole process: folds the 100 started last",
        },
    ]


async def _cli_list(nats_url: str) -> float:
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        HELMLINE,
        "sessions",
        "--tenant",
        "bench",
        "--json",
        env={**os.environ, "HELMLINE_NATS_URL": nats_url},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return (time.perf_counter() - began) * 1000
