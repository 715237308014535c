"""Real MCP servers for tests and benchmarks: the npm `server-everything` (installed by
`make mcp-servers` from tests/mcp-servers) started over Streamable HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helmline.runtime.testing import free_port

EVERYTHING_SCRIPT = Path(
    "tests/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
"""Where `npm ci` puts the server, relative to the checkout."""


@contextmanager
def server_everything(script: Path, log_dir: Path, port: int | None = None) -> Iterator[str]:
    """`server-everything` over Streamable HTTP on `port` (a free one by default); yields
    its MCP URL."""
    if not script.exists():
        raise RuntimeError(f"{script} is missing: run `make mcp-servers` (npm ci)")
    port = port or free_port()
    with (log_dir / "server-everything.log").open("ab") as log:
        process = subprocess.Popen(
            ["node", str(script), "streamableHttp"],
            env={**os.environ, "PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("server-everything did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
