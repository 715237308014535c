"""Real MCP servers for the end-to-end tests: the npm `server-everything` over Streamable
HTTP, started by the tests; the PyPI servers run over stdio by the gateway itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from helmline.runtime.testing import ServiceProcesses
from helmline.tool_gateway.testing import EVERYTHING_SCRIPT, server_everything

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")


@contextmanager
def federating_stack(
    nats_url: str, folder: Path, servers: list[dict[str, Any]]
) -> Iterator[ServiceProcesses]:
    """Every service as a process of its own (data under `folder`), the tool gateway
    federating `servers`: the entries of an MCP servers file."""
    config = folder / "mcp-servers.yaml"
    config.write_text(yaml.safe_dump({"servers": servers}))
    running = ServiceProcesses(nats_url, folder)
    try:
        for name in SERVICES:
            env = {"HELMLINE_MCP_SERVERS": str(config)} if name == "tool_gateway" else None
            running.start(name, env)
        yield running
    finally:
        running.stop_all()


@contextmanager
def everything(log_dir: Path) -> Iterator[str]:
    """`server-everything` over Streamable HTTP; yields its MCP URL."""
    with server_everything(ROOT / EVERYTHING_SCRIPT, log_dir) as url:
        yield url


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
