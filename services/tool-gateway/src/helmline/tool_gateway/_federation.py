"""Every configured MCP server, the registry they make up, and its publication.

The registry goes to the tools stream whenever it changes (a server connects, drops, lists
other tools, or its breaker moves), so the approval service, the planner and the console
see the tools this gateway can call; breaker changes go there too, as their own events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    MCP_NAME_SEPARATOR,
    TOOL_REGISTRY_SUBJECT,
    TOOLS_SESSION,
    TOOLS_TENANT,
    Payload,
    ToolCircuitChanged,
    ToolSpec,
    circuit_subject,
    new_event,
)
from helmline.runtime import EventStore
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._mcp import McpServer
from helmline.tool_gateway._registry import registry_event
from helmline.tool_gateway._resilience import CircuitChange

logger = logging.getLogger(__name__)

SOURCE = "helmline/tool-gateway"


class Federation:
    """The gateway's MCP servers and the tools they and the built-ins offer."""

    def __init__(self, store: EventStore, configs: Iterable[ServerConfig]) -> None:
        self._store = store
        self.servers: dict[str, McpServer] = {
            config.id: McpServer(config, self._changed) for config in configs
        }
        self.tools: Mapping[str, ToolSpec] = dict(BUILTIN_TOOLS_BY_NAME)
        self._dirty = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Publish the built-in registry at once, then connect every server in the background
        (one that is down is retried there; it never holds the gateway up)."""
        await self._publish()
        self._publisher = asyncio.create_task(self._publish_changes(), name="tool-registry")
        for server in self.servers.values():
            server.start()

    async def stop(self) -> None:
        """Close every connection."""
        for server in self.servers.values():
            await server.stop()
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher

    def server_of(self, tool: str) -> McpServer | None:
        """The configured server a federated tool's name points at (`<server>__<tool>`)."""
        server, separator, _ = tool.partition(MCP_NAME_SEPARATOR)
        return self.servers.get(server) if separator else None

    async def circuit_changed(self, server: McpServer, change: CircuitChange) -> None:
        """Record a breaker's move on the tools stream (the server shows it in the registry)."""
        logger.warning(
            "circuit of MCP server %s: %s -> %s (%s)",
            server.config.id,
            change.previous,
            change.state,
            change.reason,
        )
        event = ToolCircuitChanged(
            server=server.config.id,
            state=change.state,
            previous=change.previous,
            failures=change.failures,
            reason=change.reason,
            retry_at=_wall_clock(change.retry_at) if change.retry_at is not None else None,
        )
        await self._send(circuit_subject(server.config.id), event, uuid.uuid4())

    def _changed(self) -> None:
        self.tools = {
            **BUILTIN_TOOLS_BY_NAME,
            **{tool.name: tool for server in self.servers.values() for tool in server.view.tools},
        }
        self._dirty.set()

    async def _publish_changes(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._publish()
            except Exception as error:
                logger.warning("could not publish the tool registry: %s", error)
                await asyncio.sleep(1.0)
                self._dirty.set()

    async def _publish(self) -> None:
        registry = registry_event(server.view for server in self.servers.values())
        # A fresh id each time: a registry equal to an earlier one (a breaker closed again)
        # must still become the newest.
        await self._send(TOOL_REGISTRY_SUBJECT, registry, uuid.uuid4())

    async def _send(self, subject: str, data: Payload, event_id: uuid.UUID) -> None:
        event = new_event(
            data, tenant=TOOLS_TENANT, session_id=TOOLS_SESSION, source=SOURCE, event_id=event_id
        )
        await self._store.publish(subject, event)


def _wall_clock(monotonic_s: float) -> datetime:
    """A time of the breakers' monotonic clock as a time of day, for other processes."""
    return datetime.now(UTC) + timedelta(seconds=monotonic_s - time.monotonic())
