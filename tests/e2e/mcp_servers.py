"""Real MCP servers for the end-to-end tests: the npm `server-everything` over Streamable
HTTP, started by the tests; the PyPI servers run over stdio by the gateway itself."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import yaml
from nats.js import JetStreamContext

from helmline.cli._record import ComponentRecord, ProcessRecord, StackRecord, write_record
from helmline.runtime import latest_tool_registry
from helmline.runtime.testing import ServiceProcesses, eventually
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


async def until_federated(js: JetStreamContext, server: str) -> None:
    """Wait until the gateway's newest registry says `server` is available."""

    async def federated() -> bool:
        registry = await latest_tool_registry(js)
        return registry is not None and any(
            entry.server == server and entry.available for entry in registry.servers
        )

    await eventually(federated, timeout_s=60, what=f"the {server} server federated")


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


def helmline_status(stack: ServiceProcesses, data_dir: Path, *args: str) -> str:
    """What `helmline status` prints of the services `stack` runs, as it would of a stack
    `helmline up` had started with them: a stack record naming them is written first."""
    components = []
    for name, process in stack.processes.items():
        port = stack.ports[name]
        found = psutil.Process(process.pid)
        components.append(
            ComponentRecord(
                name=name,
                kind="service",
                address=f"http://127.0.0.1:{port}",
                process=ProcessRecord(
                    pid=process.pid, create_time=found.create_time(), argv=found.cmdline()
                ),
                health_port=port,
            )
        )
    write_record(
        StackRecord(
            data_dir=data_dir,
            started_at=datetime.now(UTC),
            nats_url=stack.nats_url,
            database_url="",
            components=tuple(components),
            complete=True,
        )
    )
    helmline = Path(sys.executable).with_name("helmline")
    listed = subprocess.run(
        [str(helmline), "status", "--data-dir", str(data_dir), *args],
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode in (0, 1), listed.stderr
    return listed.stdout
