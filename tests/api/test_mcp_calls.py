"""MCP resources through the whole stack: a playbook step reads a server's resource as
context (`docs__read_resource`), made safe as tool output is, and `GET /mcp/servers` counts
the tenant's calls and errors of the last minute. The stack federates the gateway tests'
resources server (services/tool-gateway/tests/resources_mcp_server.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from helmline.runtime.testing import ServiceProcesses, eventually
from tests.api.conftest import KeyMaker, stack
from tests.api.test_api import assert_problem, start, until

RESOURCES_SERVER = (
    Path(__file__).resolve().parents[2] / "services/tool-gateway/tests/resources_mcp_server.py"
)
SERVER = "docs"


@pytest.fixture(scope="module")
def services(
    nats_url: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcesses]:
    """The stack, its gateway federating the resources server as `docs`."""
    folder = tmp_path_factory.mktemp("stack")
    servers = folder / "mcp-servers.yaml"
    server = {
        "id": SERVER,
        "stdio": {"command": sys.executable, "args": [str(RESOURCES_SERVER)]},
        "risk": "low",
        "retries": 0,
    }
    servers.write_text(yaml.safe_dump({"servers": [server]}))
    with stack(nats_url, database_url, folder, HELMLINE_MCP_SERVERS=str(servers)) as running:
        yield running


def read(step_id: str, uri: str, *after: str) -> dict[str, Any]:
    tool = f"{SERVER}__read_resource"
    return {"id": step_id, "tool": tool, "arguments": {"uri": uri}, "depends_on": list(after)}


async def test_a_playbook_reads_resources_as_context_and_the_calls_are_counted(
    client: httpx.AsyncClient, make_key: KeyMaker, tenant: str
) -> None:
    admin = await make_key(tenant, "admin")

    async def federated() -> bool:
        tools = (await client.get("/tools", headers=admin)).json()
        return any(tool["name"] == f"{SERVER}__read_resource" for tool in tools)

    await eventually(federated, timeout_s=60, what="the resources server federated")

    # A URI the server does not list is refused with the playbook, before anything starts.
    unlisted = {"goal": "read a secret", "steps": [read("shadow", "file:///etc/shadow")]}
    refused = await client.post("/sessions", json={"playbook": unlisted}, headers=admin)
    assert_problem(refused, 422, "body.playbook.steps.0.arguments")

    playbook = {
        "goal": "read the guide, then the leaky page",
        "steps": [read("guide", "docs://guide"), read("leaky", "docs://leaky", "guide")],
    }
    session_id = await start(client, admin, playbook)
    state = await until(client, admin, session_id, "completed", "failed")
    assert state["status"] == "completed", state
    guide = state["steps"]["guide"]["output"]
    assert guide["text"] == "Step one: read the guide. Step two: there is no step two."
    leaky = state["steps"]["leaky"]["output"]
    assert "AKIAIOSFODNN7EXAMPLE" not in str(leaky)
    assert "docs://leaky" in str(leaky)

    broken = {"goal": "fail once", "steps": [{"id": "b", "tool": f"{SERVER}__broken"}]}
    failed = await start(client, admin, broken)
    assert (await until(client, admin, failed, "completed", "failed"))["status"] == "failed"

    async def counted() -> dict[str, Any] | None:
        servers = (await client.get("/mcp/servers", headers=admin)).json()["servers"]
        (docs,) = [s for s in servers if s["status"]["server"] == SERVER]
        return docs if docs["calls_last_minute"] == 3 else None

    docs = await eventually(counted, timeout_s=30, what="the read model's count of the calls")
    assert docs["errors_last_minute"] == 1
    assert [r["uri"] for r in docs["status"]["resources"]][:2] == ["docs://guide", "docs://leaky"]
    # Another tenant's figures are its own.
    other = await make_key(f"{tenant}-other", "viewer")
    servers = (await client.get("/mcp/servers", headers=other)).json()["servers"]
    (theirs,) = [s for s in servers if s["status"]["server"] == SERVER]
    assert (theirs["calls_last_minute"], theirs["errors_last_minute"]) == (0, 0)
