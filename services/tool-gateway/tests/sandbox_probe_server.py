"""A small MCP server that tries what its sandbox should refuse, for the gateway's sandbox
tests: `python sandbox_probe_server.py` over stdio, or `python sandbox_probe_server.py PORT`
over Streamable HTTP on 127.0.0.1:PORT. Each tool reports what happened rather than failing,
so a test reads the errno the sandbox caused."""

from __future__ import annotations

import hashlib
import os
import socket
import sys

import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver import Context

server = MCPServer("helmline-sandbox-probe")


def _failed(error: OSError) -> str:
    return f"failed: {type(error).__name__}: {error.strerror}"


@server.tool()
def read(path: str) -> str:
    """Read a file: its first 100 characters, or how reading failed."""
    try:
        with open(path) as file:
            return f"read: {file.read(100)}"
    except OSError as error:
        return _failed(error)


@server.tool()
def write(path: str, text: str) -> str:
    """Write a file: `written`, or how writing failed."""
    try:
        with open(path, "w") as file:
            file.write(text)
    except OSError as error:
        return _failed(error)
    return "written"


@server.tool()
def connect(host: str, port: int, message: str) -> str:
    """Connect, send the message, and return the first line answered (or how it failed)."""
    try:
        with socket.create_connection((host, port), timeout=5) as connection:
            connection.sendall(message.encode() + b"\n")
            answer = connection.makefile().readline().strip()
    except OSError as error:
        return _failed(error)
    return f"answered: {answer}" if answer else "failed: closed without an answer"


@server.tool()
def ask_proxy(path: str, destination: str) -> str:
    """Talk to the egress proxy's socket directly, asking for `destination`: its answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(5)
            connection.connect(path)
            connection.sendall(destination.encode() + b"\n")
            return connection.makefile().readline().strip() or "closed"
    except OSError as error:
        return _failed(error)


@server.tool()
def allocate(mb: int) -> str:
    """Hold `mb` MiB for a moment: `allocated`, or how it failed."""
    try:
        held = bytearray(mb * 1024 * 1024)
    except MemoryError:
        return "failed: MemoryError"
    return f"allocated {len(held) // (1024 * 1024)} MiB"


@server.tool()
def capabilities() -> dict[str, int]:
    """The capability sets of this process (`CapEff`, `CapPrm`, ...), as numbers."""
    with open("/proc/self/status") as status:
        fields = (line.split(":", 1) for line in status if line.startswith("Cap"))
        return {name: int(value, 16) for name, value in fields}


@server.tool()
def environment() -> dict[str, str]:
    """The environment's variables, each value's SHA-256 (never the value itself)."""
    return {name: hashlib.sha256(value.encode()).hexdigest() for name, value in os.environ.items()}


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The SHA-256 of a request header's value (over HTTP)."""
    value = (ctx.headers or {}).get(name.lower(), "")
    return hashlib.sha256(value.encode()).hexdigest()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    else:
        server.run("stdio")
