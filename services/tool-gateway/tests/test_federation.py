"""Federation over time: a server down at start comes in when it is up; a server that
changes its tools has them listed again."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from nats.js import JetStreamContext

from helmline.contracts import ToolCallCompleted, ToolCallFailed
from helmline.runtime import latest_tool_registry
from helmline.runtime.testing import eventually, free_port
from helmline.tool_gateway.testing import EVERYTHING_SCRIPT, server_everything

# Not a package, so mypy cannot follow; pytest imports it all the same.
from .conftest import (  # type: ignore[import-not-found]
    Calls,
    federated,
    gateway_in_process,
    write_servers_file,
)

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("drop_consumer")


async def test_a_server_down_at_start_is_unavailable_then_federated_once_it_is_up(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    tmp_path: Path,
) -> None:
    port = free_port()
    servers = tmp_path / "servers.yaml"
    servers.write_text(
        yaml.safe_dump(
            {"servers": [{"id": server_id, "http": {"url": f"http://127.0.0.1:{port}/mcp"}}]}
        )
    )
    async with gateway_in_process(nats_url, servers, tenant):

        async def listed_as_down() -> bool:
            registry = await latest_tool_registry(js)
            assert registry is not None
            return any(
                s.server == server_id and not s.available and s.error for s in registry.servers
            )

        await eventually(listed_as_down, timeout_s=30, what="the server listed as unavailable")
        refused = await calls.outcome(await calls.authorise(f"{server_id}__echo", message="hi"))
        assert isinstance(refused, ToolCallFailed)
        assert refused.error.kind == "unavailable"
        assert refused.error.retryable
        with server_everything(ROOT / EVERYTHING_SCRIPT, tmp_path, port=port):
            await federated(js, server_id)
            done = await calls.outcome(await calls.authorise(f"{server_id}__echo", message="hi"))
            assert isinstance(done, ToolCallCompleted), done
            assert done.output == "Echo: hi"


async def test_a_server_that_changes_its_tools_has_them_listed_again(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    servers = write_servers_file(tmp_path / "servers.yaml", server_id, state_dir)
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        grown = await calls.outcome(await calls.authorise(f"{server_id}__grow", name="sprout"))
        assert isinstance(grown, ToolCallCompleted), grown

        async def sprout_listed() -> bool:
            registry = await latest_tool_registry(js)
            assert registry is not None
            return any(tool.name == f"{server_id}__sprout" for tool in registry.tools)

        await eventually(sprout_listed, timeout_s=30, what="the new tool in the registry")
        echoed = await calls.outcome(await calls.authorise(f"{server_id}__sprout", message="hi"))
        assert isinstance(echoed, ToolCallCompleted), echoed
