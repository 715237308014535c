"""MCP federation end to end: real MCP servers from PyPI (stdio) and npm (Streamable HTTP)
behind the tool gateway, called from playbook sessions through every service."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from nats.js import JetStreamContext

from helmline.cli._services import service_readiness
from helmline.contracts import (
    Actor,
    PlanStep,
    Playbook,
    ToolCallCompleted,
    ToolRegistryPublished,
)
from helmline.runtime import EventStore, latest_tool_registry
from helmline.runtime.testing import ServiceProcesses, eventually, run_playbook

from .mcp_servers import everything, federating_stack, git_repository, helmline_status

PERSON = Actor(id="ana")
SERVERS = ("time", "clock", "git", "everything")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return git_repository(tmp_path_factory.mktemp("repo") / "repo")


@pytest.fixture(scope="module")
def everything_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with everything(tmp_path_factory.mktemp("everything")) as url:
        yield url


@pytest.fixture(scope="module")
def servers(repository: Path, everything_url: str) -> list[dict[str, Any]]:
    python = sys.executable
    time_server = {"command": python, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
    return [
        {"id": "time", "stdio": time_server, "risk": "low"},
        # The same tools again under another id: both stay callable by their prefix.
        {"id": "clock", "stdio": time_server, "risk": "low"},
        {
            "id": "git",
            "stdio": {
                "command": python,
                "args": ["-m", "mcp_server_git", "--repository", str(repository)],
            },
            "sandbox": {"write": [str(repository)]},
            "risk": "low",
        },
        {"id": "everything", "http": {"url": everything_url}, "risk": "low"},
    ]


@pytest.fixture(scope="module")
def stack(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory, servers: list[dict[str, Any]]
) -> Iterator[ServiceProcesses]:
    with federating_stack(nats_url, tmp_path_factory.mktemp("stack"), servers) as running:
        yield running


async def _federated(js: JetStreamContext) -> ToolRegistryPublished:
    async def every_server_available() -> ToolRegistryPublished | None:
        registry = await latest_tool_registry(js)
        if registry is None:
            return None
        up = {server.server for server in registry.servers if server.available}
        return registry if up == set(SERVERS) else None

    registry: ToolRegistryPublished = await eventually(
        every_server_available, timeout_s=60, what="every MCP server federated"
    )
    return registry


async def test_a_playbook_calls_tools_of_real_mcp_servers_over_stdio_and_http(
    stack: ServiceProcesses,
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
    repository: Path,
) -> None:
    await _federated(js)
    steps = {
        "now": ("time__get_current_time", {"timezone": "Europe/Paris"}),
        "also_now": ("clock__get_current_time", {"timezone": "UTC"}),
        "status": ("git__git_status", {"repo_path": str(repository)}),
        "echo": ("everything__echo", {"message": "hello from helmline"}),
    }
    playbook = Playbook(
        goal="ask real MCP servers",
        steps=tuple(
            PlanStep(id=step, tool=tool, arguments=arguments)
            for step, (tool, arguments) in steps.items()
        ),
    )
    session_id = await run_playbook(store, tenant, playbook, PERSON)
    state = (await store.load(tenant, session_id)).state
    assert state.status == "completed", state.outcome
    completed = {
        stored.event.data.step_id: stored.event.data
        for stored in await store.read_all(tenant, session_id)
        if isinstance(stored.event.data, ToolCallCompleted)
    }
    assert set(completed) == set(steps)
    now = completed["now"].output
    assert isinstance(now, dict)
    assert now["timezone"] == "Europe/Paris"
    also_now = completed["also_now"].output
    assert isinstance(also_now, dict)
    assert also_now["timezone"] == "UTC"
    assert "On branch" in str(completed["status"].output)
    assert completed["echo"].output == "Echo: hello from helmline"


async def test_helmline_tools_lists_the_federated_registry_with_source_schema_and_risk(
    stack: ServiceProcesses, js: JetStreamContext
) -> None:
    await _federated(js)
    listed = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("helmline")),
        "tools",
        "--json",
        env={"HELMLINE_NATS_URL": stack.nats_url, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(listed.communicate(), timeout=60)
    assert listed.returncode == 0
    registry = ToolRegistryPublished.model_validate(json.loads(out))
    tools = {tool.name: tool for tool in registry.tools}
    assert tools["echo"].server == "builtin"
    for server in ("time", "clock"):
        tool = tools[f"{server}__get_current_time"]
        assert (tool.server, tool.remote_name, tool.risk) == (server, "get_current_time", "low")
        assert tool.parameters["required"] == ["timezone"]
    assert tools["git__git_status"].executor == "mcp"
    assert tools["everything__echo"].server == "everything"
    assert {s.server: (s.transport, s.available, s.health) for s in registry.servers} == {
        "time": ("stdio", True, "healthy"),
        "clock": ("stdio", True, "healthy"),
        "git": ("stdio", True, "healthy"),
        "everything": ("http", True, "healthy"),
    }


async def test_helmline_status_shows_each_servers_health_and_a_killed_one_dead_then_restarted(
    stack: ServiceProcesses, js: JetStreamContext, tmp_path: Path
) -> None:
    await _federated(js)
    status = json.loads(helmline_status(stack, tmp_path, "--json"))
    (gateway,) = [c for c in status["components"] if c["name"] == "tool_gateway"]
    assert {topic: fact.split(" (")[0] for topic, fact in gateway["about"].items()} == {
        f"MCP server {server}": "healthy" for server in SERVERS
    }
    assert gateway["about"]["MCP server git"].startswith("healthy (stdio, 12 tools, 0 restarts)")

    (git,) = [
        child
        for child in psutil.Process(stack.processes["tool_gateway"].pid).children()
        if "mcp_server_git" in child.cmdline()
    ]
    git.kill()
    port = stack.ports["tool_gateway"]

    def git_health() -> str:
        return service_readiness(port).about["MCP server git"]

    await eventually(
        lambda: git_health().startswith("dead (stdio, 12 tools, 0 restarts): its process exited"),
        what="git shown dead",
    )
    await eventually(
        lambda: git_health().startswith("healthy (stdio, 12 tools, 1 restarts)"),
        timeout_s=30,
        what="git shown healthy again",
    )
    shown = helmline_status(stack, tmp_path)
    assert "MCP server git: healthy (stdio, 12 tools, 1 restarts)" in shown, shown
    assert "MCP server everything: healthy (http, " in shown, shown
