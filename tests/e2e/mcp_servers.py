"""Real MCP servers for the end-to-end tests: the npm `server-everything` over Streamable
HTTP, started by the tests; the PyPI servers run over stdio by the gateway itself."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helmline.runtime.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = (
    ROOT / "tests/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


@contextmanager
def server_everything(log_dir: Path) -> Iterator[str]:
    """`server-everything` over Streamable HTTP on a free port; yields its MCP URL."""
    if not EVERYTHING.exists():
        raise RuntimeError(f"{EVERYTHING} is missing: run `make mcp-servers` (npm ci)")
    port = free_port()
    with (log_dir / "server-everything.log").open("ab") as log:
        process = subprocess.Popen(
            ["node", str(EVERYTHING), "streamableHttp"],
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


def git_repository(path: Path) -> Path:
    """A git repository with one commit."""
    path.mkdir(parents=True, exist_ok=True)
    environment = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    (path / "README.md").write_text("hello\n")
    for command in (["init", "-q"], ["add", "README.md"], ["commit", "-q", "-m", "first"]):
        subprocess.run(["git", *command], cwd=path, env=environment, check=True)
    return path
