"""Everywhere the stack keeps or shows what happened, read back whole as bytes: the log as
stored, what the CLI prints (events, export, show), the read model, every GET of the API, its
event streams, the services' log files and the spans they exported. The secrets part looks
for planted values in each; the API part reads the same API."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from tests.safety.stack import Stack

HELMLINE = str(Path(sys.executable).with_name("helmline"))
SSE_DEADLINE_S = 30.0


async def helmline(stack: Stack, *args: str) -> bytes:
    """What `helmline ARGS` prints (stdout and stderr) against the stack; it must succeed."""
    process = await asyncio.create_subprocess_exec(
        HELMLINE,
        *args,
        env={"HELMLINE_NATS_URL": stack.nats_url, "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, (args, err.decode()[-2000:])
    return out + err


async def read_model(database_url: str) -> bytes:
    """Every row of every table of the read model, as text."""
    connection = await asyncpg.connect(database_url)
    try:
        tables = await connection.fetch(
            "SELECT schemaname, tablename FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        )
        assert tables, "the read model has no table"
        rows = bytearray()
        for table in tables:
            name = f'"{table["schemaname"]}"."{table["tablename"]}"'
            for row in await connection.fetch(f"SELECT t::text AS row FROM {name} t"):
                rows += row["row"].encode() + b"\n"
        return bytes(rows)
    finally:
        await connection.close()


def get_routes(openapi: dict[str, Any]) -> list[str]:
    """Paths of the API's GET operations that answer once (event streams are read apart)."""
    found = []
    for path, operations in openapi["paths"].items():
        get = operations.get("get")
        if get is None:
            continue
        content = get.get("responses", {}).get("200", {}).get("content", {})
        if "text/event-stream" not in content:
            found.append(path)
    return found


async def api_reads(
    client: httpx.AsyncClient, headers: dict[str, str], session_ids: Iterable[str]
) -> bytes:
    """Every GET of the OpenAPI document, for each session where the path names one."""
    openapi = (await client.get("/openapi.json")).json()
    bodies = bytearray()
    for path in get_routes(openapi):
        ids = list(session_ids) if "{session_id}" in path else [""]
        for session_id in ids:
            if "{" in path.replace("{session_id}", ""):
                continue  # A path naming something else (a key) is probed by the API part.
            response = await client.get(path.replace("{session_id}", session_id), headers=headers)
            bodies += response.content
    return bytes(bodies)


async def sse_until(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], last_seq: int
) -> bytes:
    """An event stream read from its start through the event of sequence `last_seq`."""
    received = bytearray()

    async def read() -> None:
        async with client.stream("GET", path, headers=headers) as response:
            assert response.status_code == 200, path
            reached = False
            async for line in response.aiter_lines():
                received.extend(line.encode() + b"\n")
                if line.startswith("id:") and int(line[3:].strip()) >= last_seq:
                    reached = True
                elif reached and not line:
                    return  # The end of that event's frame: its data is in.

    await asyncio.wait_for(read(), timeout=SSE_DEADLINE_S)
    return bytes(received)


def service_logs(stack: Stack) -> bytes:
    logs = stack.logs
    assert {log.stem for log in logs} >= {"planner", "tool_gateway", "sandbox", "api"}, logs
    return b"".join(log.read_bytes() for log in logs)
