"""MCP resources and prompts through the gateway (resources_mcp_server.py): listed in the
registry, read as context through `<server>__read_resource`, whose output is made safe and
capped like any tool's; a URI the server does not list is refused before it is sent."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import yaml
from nats.js import JetStreamContext

from helmline.contracts import (
    McpPromptArgument,
    ToolCallCompleted,
    ToolCallFailed,
    ToolRegistryPublished,
    ToolServerStatus,
)
from helmline.runtime import latest_tool_registry
from helmline.runtime.testing import eventually

# Not a package, so mypy cannot follow; pytest imports it all the same.
from .conftest import (  # type: ignore[import-not-found]
    Calls,
    federated,
    gateway_in_process,
)

RESOURCES_SERVER = Path(__file__).with_name("resources_mcp_server.py")
HELMLINE = str(Path(sys.executable).with_name("helmline"))


def servers_file(path: Path, server_id: str) -> Path:
    server = {
        "id": server_id,
        "stdio": {"command": sys.executable, "args": [str(RESOURCES_SERVER), "256"]},
        "risk": "low",
    }
    path.write_text(yaml.safe_dump({"servers": [server]}))
    return path


def status_of(registry: ToolRegistryPublished, server_id: str) -> ToolServerStatus:
    return next(server for server in registry.servers if server.server == server_id)


async def test_resources_and_prompts_are_listed_and_a_resource_is_read_safe_and_capped(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    tmp_path: Path,
    drop_consumer: None,
) -> None:
    servers = servers_file(tmp_path / "servers.yaml", server_id)
    async with gateway_in_process(nats_url, servers, tenant, max_output_bytes=4096):
        registry = await federated(js, server_id)
        status = status_of(registry, server_id)
        assert [resource.uri for resource in status.resources] == [
            "docs://guide",
            "docs://leaky",
            "docs://big",
            "docs://logo",
        ]
        assert status.resources[0].description == "How to use the docs."
        # A server's words about its resources go through output safety too.
        assert "AKIAIOSFODNN7EXAMPLE" not in status.resources[1].description
        assert status.resources[1].description.startswith("A page that quotes ")
        assert status.resources[2].mime_type == "text/plain"
        prompts = {prompt.name: prompt for prompt in status.prompts}
        assert set(prompts) == {"summarise", "greet"}
        assert prompts["summarise"].arguments == (
            McpPromptArgument(name="document", required=True),
            McpPromptArgument(name="reader", required=False),
        )
        reader = next(tool for tool in registry.tools if tool.name == f"{server_id}__read_resource")
        assert (reader.effect, reader.action, reader.idempotent) == ("none", "read", True)
        assert reader.parameters["properties"]["uri"]["enum"] == [
            resource.uri for resource in status.resources
        ]

        # `helmline tools` lists them under their server, the server's words as they are.
        process = await asyncio.create_subprocess_exec(
            HELMLINE,
            "tools",
            env={"HELMLINE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0
        listing = out.decode()
        assert "  resource docs://guide: guide (How to use the docs.)" in listing
        assert (
            "  prompt summarise(document, reader?): Summarise a document for a reader." in listing
        )
        assert f"{server_id}__read_resource" in listing

        guide = await calls.outcome(
            await calls.authorise(f"{server_id}__read_resource", uri="docs://guide")
        )
        assert isinstance(guide, ToolCallCompleted), guide
        assert guide.output == {
            "uri": "docs://guide",
            "mime_type": "text/plain",
            "text": "Step one: read the guide. Step two: there is no step two.",
        }
        assert guide.untrusted  # A server's words, as its tools' results are.

        leaky = await calls.outcome(
            await calls.authorise(f"{server_id}__read_resource", uri="docs://leaky")
        )
        assert isinstance(leaky, ToolCallCompleted), leaky
        assert "AKIAIOSFODNN7EXAMPLE" not in str(leaky.output)
        assert leaky.redacted_by == {"aws_access_key_id": 1}
        assert leaky.injection_suspected

        big = await calls.outcome(
            await calls.authorise(f"{server_id}__read_resource", uri="docs://big")
        )
        assert isinstance(big, ToolCallCompleted), big
        assert big.truncated
        assert len(str(big.output).encode()) < 8192  # 256 KiB read, cut to the 4 KiB cap.

        logo = await calls.outcome(
            await calls.authorise(f"{server_id}__read_resource", uri="docs://logo")
        )
        assert isinstance(logo, ToolCallCompleted), logo
        assert isinstance(logo.output, dict)
        assert logo.output["omitted"] is True
        assert "text" not in logo.output

        unlisted = await calls.outcome(
            await calls.authorise(f"{server_id}__read_resource", uri="file:///etc/shadow")
        )
        assert isinstance(unlisted, ToolCallFailed), unlisted
        assert unlisted.error.kind == "validation"


async def test_a_resource_added_later_is_listed_again_and_readable(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    tmp_path: Path,
    drop_consumer: None,
) -> None:
    servers = servers_file(tmp_path / "servers.yaml", server_id)
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        added = await calls.outcome(await calls.authorise(f"{server_id}__add_resource"))
        assert isinstance(added, ToolCallCompleted), added

        async def listed_again() -> ToolServerStatus | None:
            registry = await latest_tool_registry(js)
            status = status_of(registry, server_id) if registry is not None else None
            uris = [resource.uri for resource in status.resources] if status else []
            return status if "docs://added" in uris else None

        await eventually(listed_again, timeout_s=30, what="docs://added listed")
        read = await calls.outcome(
            await calls.authorise(f"{server_id}__read_resource", uri="docs://added")
        )
        assert isinstance(read, ToolCallCompleted), read
        assert isinstance(read.output, dict)
        assert read.output["text"] == "added later"
