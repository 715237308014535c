"""`helmline run --playbook FILE --wait` on long sessions: how long after the session's end
the command returns, beside the session's own duration.

Each session is a chain of echo steps (`steps.echo_chain`) run by every service in its own
process; the command is a whole process, its output not a terminal (as in CI or a script).
Beside them, `show` and `events` of the ended session, whole processes too (each reads the
log once). `HELMLINE_FOLLOW_STEPS=20,100` runs other lengths.
Following costs in proportion to what changed, so the command returns within moments of
the session's end however long the session was.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from steps import echo_chain, services_running

from helmline.cli._follow import session_ids
from helmline.contracts import SessionCancelled, SessionCompleted, SessionFailed, SessionStarted
from helmline.runtime import EventStore

STEPS = (500, 1_000, 3_000)
HELMLINE = Path(sys.executable).parent / "helmline"
TIMEOUT_S = 600.0


async def run() -> list[dict[str, Any]]:
    figures = []
    async with services_running() as (_, store, services):
        await _follow(store, services.nats_url, 5, "warmup")
        chosen = os.environ.get("HELMLINE_FOLLOW_STEPS")
        for steps in [int(n) for n in chosen.split(",")] if chosen else STEPS:
            figures.append(await _follow(store, services.nats_url, steps, f"follow{steps}"))
    return figures


async def _follow(store: EventStore, nats_url: str, steps: int, tenant: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        playbook = Path(folder) / "chain.yaml"
        # JSON is YAML: the playbook as its contract dumps it.
        playbook.write_text(json.dumps(echo_chain(steps).model_dump(mode="json")))
        began = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            HELMLINE,
            "run",
            "--playbook",
            str(playbook),
            "--wait",
            "--tenant",
            tenant,
            "--json",
            env={**os.environ, "HELMLINE_NATS_URL": nats_url},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(process.communicate(), timeout=TIMEOUT_S)
        except TimeoutError:
            # A follower that never returns is a figure too (a stalled subscription, say).
            process.kill()
            _, err = await process.communicate()
        returned = datetime.now(UTC)
        command_s = time.perf_counter() - began
    (session_id,) = await session_ids(store.js, tenant)
    log = await store.read_all(tenant, session_id)
    started = next(s.event.time for s in log if isinstance(s.event.data, SessionStarted))
    ended = next(
        s.event.time
        for s in log
        if isinstance(s.event.data, SessionCompleted | SessionFailed | SessionCancelled)
    )
    figure = {
        "figure": "cli_follow_s",
        "steps": steps,
        "events": len(log),
        "session_s": round((ended - started).total_seconds(), 2),
        "after_end_s": round((returned - ended).total_seconds(), 2),
        "command_s": round(command_s, 2),
        "returned": process.returncode == 0,
        "target": "`run --wait` returns within 1 s of the session's end",
    }
    if process.returncode != 0:
        return {**figure, "exit": process.returncode, "error": err.decode()[-300:]}
    return {
        **figure,
        "show_s": round(await _command_s(nats_url, "show", session_id, "--tenant", tenant), 2),
        "events_s": round(await _command_s(nats_url, "events", session_id, "--tenant", tenant), 2),
    }


async def _command_s(nats_url: str, *args: str) -> float:
    """Seconds a whole `helmline` process takes, its output read from a pipe."""
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        HELMLINE,
        *args,
        env={**os.environ, "HELMLINE_NATS_URL": nats_url},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), timeout=TIMEOUT_S)
    assert process.returncode == 0, err.decode()
    return time.perf_counter() - began
