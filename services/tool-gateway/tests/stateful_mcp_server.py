"""A small MCP server that keeps state in its process, for the tests of instances per
session: `python stateful_mcp_server.py` over stdio. `remember` adds a note to what the
process holds, `recall` lists them, `identity` names this process (its pid would not: in its
sandbox every instance is pid 2), `wait` answers after a while (a call that holds a place in
the pool)."""

from __future__ import annotations

import asyncio
import uuid

from mcp.server import MCPServer

server = MCPServer("helmline-stateful-test-server")
notes: list[str] = []
IDENTITY = uuid.uuid4().hex


@server.tool()
def remember(note: str) -> str:
    """Keep a note in this process."""
    notes.append(note)
    return note


@server.tool()
def recall() -> list[str]:
    """Every note this process keeps, oldest first."""
    return notes


@server.tool()
def identity() -> str:
    """A name made when this process started, which no other process has."""
    return IDENTITY


@server.tool()
async def wait(seconds: float) -> str:
    """Answer after `seconds`."""
    await asyncio.sleep(seconds)
    return "waited"


if __name__ == "__main__":
    server.run("stdio")
