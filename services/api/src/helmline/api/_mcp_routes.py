"""The MCP routes: the federated servers as the gateway last published them (with their tools'
pins, resources and prompts) for the console's MCP page, and an admin's acceptance of a
changed tool definition, which the gateway's pins follow (as `helmline tools accept`).

Servers, tools and pins are gateway-wide, read from the tools stream; the calls and errors
of the last minute are the principal's tenant's own, from the read model.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from helmline.api._auth import Admin, Viewer
from helmline.api._problems import PROBLEM_RESPONSES, ProblemDetails, conflict, not_found
from helmline.api._reads import SessionLister
from helmline.contracts import (
    MCP_NAME_SEPARATOR,
    Risk,
    ToolDefinitionAccepted,
    ToolDefinitionChanged,
    ToolEffect,
    ToolName,
    ToolServerStatus,
    source_of,
)
from helmline.readmodel import STEPS
from helmline.runtime import (
    DefinitionError,
    Pin,
    accept_definition,
    definition_diff,
    latest_tool_registry,
    read_pin,
    read_pins,
    running_instances,
)

logger = logging.getLogger(__name__)

router = APIRouter(responses=PROBLEM_RESPONSES, tags=["mcp"])

SOURCE = source_of("api")


class McpTool(BaseModel):
    """One of a server's tools, and its pinned definition."""

    name: str
    """As the registry names it (`<server>__<tool>`)."""
    description: str
    risk: Risk
    effect: ToolEffect
    pinned_digest: str | None
    """The digest of the definition in force (first seen, or last accepted); None if no
    gateway has pinned it (the gateway's own resource reader is never pinned)."""
    held: bool
    """Whether its server lists it otherwise than pinned: its calls are refused until an
    admin accepts the change."""
    change: ToolDefinitionChanged | None = None
    """The listing that differs from the pin, waiting for acceptance."""
    diff: str | None = None
    """That change for people: each changed part as a unified diff."""


class McpServer(BaseModel):
    """A federated server as the gateway last published it, with figures of the last minute."""

    status: ToolServerStatus
    """What the gateway says of it: transport, isolation, health, breaker, resources,
    prompts, and whatever else its registry entry carries."""
    instances: int | None
    """How many instances of it run now, in every gateway process, for a server isolated
    per tenant or session (`mcp.instance.*`); None for a shared server (its one instance)."""
    calls_last_minute: int | None
    """Calls of its tools by the principal's tenant that ended in the last minute; None
    without a read model."""
    errors_last_minute: int | None
    """Of those, the ones that failed."""
    tools: list[McpTool]


class McpServers(BaseModel):
    """Every federated MCP server."""

    published: bool
    """Whether a gateway has published its registry yet (if not, no server is known)."""
    servers: list[McpServer]


class Acceptance(BaseModel):
    """An admin's acceptance of a changed tool definition."""

    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The digest of the definition the admin reviewed: refused (409) if another waits now.
    Without it, whichever change waits is accepted."""
    reason: str = Field(default="", max_length=4096)
    """Why, for the record."""


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ProblemDetails, "description": "No definition of the tool is pinned"},
    409: {"model": ProblemDetails, "description": "No change (or another one) waits"},
}


@router.get("/mcp/servers")
async def mcp_servers(principal: Viewer, request: Request) -> McpServers:
    """The MCP servers the tool gateway federates, as it last published them: each one's
    health, breaker, resources, prompts and tools, each tool with its pinned definition and
    the change that holds it, if one does; and the tenant's calls of the last minute."""
    js = request.app.state.js
    registry = await latest_tool_registry(js)
    if registry is None:
        return McpServers(published=False, servers=[])
    pins = await read_pins(js)
    running = await running_instances(js)
    figures = await _last_minute(request.app.state.lister, principal.tenant)
    servers = []
    for status in registry.servers:
        calls, errors = figures.get(status.server, (0, 0)) if figures is not None else (None, None)
        tools = [
            _tool(tool.name, tool.description, tool.risk, tool.effect, pins.get(tool.name))
            for tool in registry.tools
            if tool.server == status.server
        ]
        instances = running[status.server] if status.isolation != "shared" else None
        servers.append(
            McpServer(
                status=status,
                instances=instances,
                calls_last_minute=calls,
                errors_last_minute=errors,
                tools=tools,
            )
        )
    return McpServers(published=True, servers=servers)


ToolPath = Annotated[ToolName, Path(description="The tool, as the registry names it.")]


@router.post("/tools/{tool}/accept", responses=NOT_FOUND)
async def accept_tool_definition(
    tool: ToolPath, body: Acceptance, principal: Admin, request: Request
) -> ToolDefinitionAccepted:
    """Accept the changed definition of an MCP tool (as `helmline tools accept`): it is
    pinned in place of the one before (`tool.definition.accepted`, naming the admin), and
    the tool's calls run again. Tools are the gateway's, shared by every tenant."""
    pin = await read_pin(request.app.state.js, tool)
    if pin is None:
        raise not_found(f"no definition of {tool} is pinned: no gateway has listed it")
    if pin.change is None:
        raise conflict(f"{tool} is listed as pinned: no change waits for acceptance")
    if body.digest is not None and body.digest != pin.change.digest:
        raise conflict(
            f"the change waiting for {tool} is {pin.change.digest}, not the one reviewed: "
            "review it again"
        )
    try:
        return await accept_definition(
            request.app.state.store, tool, by=principal.actor(), source=SOURCE, reason=body.reason
        )
    except DefinitionError as error:  # Accepted (or listed as pinned again) meanwhile.
        raise conflict(str(error)) from error


def _tool(name: str, description: str, risk: Risk, effect: ToolEffect, pin: Pin | None) -> McpTool:
    change = pin.change if pin is not None else None
    return McpTool(
        name=name,
        description=description,
        risk=risk,
        effect=effect,
        pinned_digest=pin.digest if pin is not None else None,
        held=change is not None,
        change=change,
        diff=definition_diff(change) if change is not None else None,
    )


LAST_MINUTE_QUERY = f"""
SELECT split_part(tool, '{MCP_NAME_SEPARATOR}', 1) AS server,
       count(*) AS calls,
       count(*) FILTER (WHERE status = 'failed') AS errors
FROM {STEPS.name}
WHERE tenant = $1
  AND finished_at >= now() - interval '1 minute'
  AND status IN ('succeeded', 'failed')
  AND strpos(tool, '{MCP_NAME_SEPARATOR}') > 0
GROUP BY 1
"""


async def _last_minute(lister: SessionLister, tenant: str) -> dict[str, tuple[int, int]] | None:
    """Each server's calls and failures that ended in the last minute, for the tenant; None
    without a read model (or before the state service made its tables)."""
    pool = await lister.connected()
    if pool is None:
        return None
    try:
        async with pool.acquire() as connection:
            rows = await connection.fetch(LAST_MINUTE_QUERY, tenant)
    except asyncpg.UndefinedTableError as error:
        logger.info("read model not ready (%s): no figures of the last minute", error)
        return None
    return {row["server"]: (row["calls"], row["errors"]) for row in rows}
