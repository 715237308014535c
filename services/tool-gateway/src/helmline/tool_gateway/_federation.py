"""Every configured MCP server, the registry they make up, and its publication.

The registry goes to the tools stream whenever it changes (a server connects, drops, lists
other tools, or its breaker moves), so the approval service, the planner and the console
see the tools this gateway can call; breaker changes, each server's moves from one health
to another, and each tool's definition pinned or changed (`_pins`) go there too, as their
own events. Each server's health is also kept in the service's `about` (its `/readyz`),
which `helmline status` shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, MutableMapping
from datetime import UTC, datetime, timedelta

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    MCP_NAME_SEPARATOR,
    TOOL_REGISTRY_SUBJECT,
    TOOLS_SESSION,
    TOOLS_TENANT,
    Payload,
    ServerHealth,
    ToolCircuitChanged,
    ToolDefinitionChanged,
    ToolError,
    ToolServerHealthChanged,
    ToolSpec,
    circuit_subject,
    new_event,
    server_health_subject,
    source_of,
    tool_definition_subject,
)
from helmline.runtime import DefinitionPins, EventStore, latest_tool_registry
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._launcher import ServerLauncher
from helmline.tool_gateway._mcp import McpServer
from helmline.tool_gateway._pins import decide, event_id, refusal
from helmline.tool_gateway._registry import ServerView, registry_event
from helmline.tool_gateway._resilience import CircuitChange

logger = logging.getLogger(__name__)

SOURCE = source_of("tool-gateway")

PIN_CHECK_S = 3600.0
"""How often pins are checked for being due to be recorded again, when nothing changes."""


class Federation:
    """The gateway's MCP servers and the tools they and the built-ins offer."""

    def __init__(
        self,
        store: EventStore,
        configs: Iterable[ServerConfig],
        about: MutableMapping[str, str] | None = None,
        launcher: ServerLauncher | None = None,
    ) -> None:
        self._store = store
        launcher = launcher or ServerLauncher()
        self.servers: dict[str, McpServer] = {
            config.id: McpServer(config, self._changed, launcher) for config in configs
        }
        self.tools: Mapping[str, ToolSpec] = dict(BUILTIN_TOOLS_BY_NAME)
        self._about = about if about is not None else {}
        self._health: dict[str, ServerHealth] = {}
        """Each server's health as last told (a server is told once its first try ended)."""
        self._health_changes: list[ToolServerHealthChanged] = []
        """Told, not yet published, oldest first."""
        self.gateway = f"{socket.gethostname()}/{os.getpid()}"
        """This gateway process, as its events name it: host name and process id."""
        self._pins = DefinitionPins()
        self._dirty = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None
        for server in self.servers.values():
            self._about[_about_topic(server.config.id)] = "connecting"

    async def start(self) -> None:
        """Publish the registry at once (built-in tools, and each server's as last published,
        unavailable until it connects), then connect every server in the background (one
        that is down is retried there; it never holds the gateway up).

        A replica starting again would otherwise publish its servers without tools, and the
        approval service deny their calls as of unknown tools until they had connected.

        The pinned tool definitions are read first: a tool listed before they were would
        be taken for one seen for the first time."""
        await self._pins.follow(self._store.js)
        published = await latest_tool_registry(self._store.js)
        if published is not None:
            for server in self.servers.values():
                server.remember(
                    tuple(tool for tool in published.tools if tool.server == server.config.id)
                )
        self._changed()
        await self._publish()
        self._publisher = asyncio.create_task(self._publish_changes(), name="tool-registry")
        for server in self.servers.values():
            server.start()

    async def stop(self) -> None:
        """Close every connection."""
        for server in self.servers.values():
            await server.stop()
        await self._pins.close()
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher

    def server_of(self, tool: str) -> McpServer | None:
        """The configured server a federated tool's name points at (`<server>__<tool>`)."""
        server, separator, _ = tool.partition(MCP_NAME_SEPARATOR)
        return self.servers.get(server) if separator else None

    def refusal(self, tool: ToolSpec, authorized_for: str | None) -> ToolError | None:
        """Why a call of a federated tool is refused before it is sent: its server lists it
        otherwise than pinned (and no operator accepted the change), or otherwise than the
        definition the call was authorised for (`authorized_for`, its digest)."""
        server = self.servers.get(tool.server)
        listed = server.view.listed.get(tool.name) if server is not None else None
        return refusal(self._pins.pins.get(tool.name), listed, authorized_for)

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
        for server in self.servers.values():
            if server.tried:
                self._tell_health(server.view)
        self._dirty.set()

    def _tell_health(self, view: ServerView) -> None:
        """Keep a server's line of `about` current, and queue an event if its health moved."""
        server = view.config.id
        self._about[_about_topic(server)] = _describe_health(view)
        previous = self._health.get(server)
        if view.health == previous:
            return
        self._health[server] = view.health
        log = logger.info if view.health == "healthy" else logger.warning
        log("MCP server %s: %s -> %s (%s)", server, previous, view.health, view.error or "")
        self._health_changes.append(
            ToolServerHealthChanged(
                server=server,
                transport="stdio" if view.config.stdio is not None else "http",
                health=view.health,
                previous=previous,
                reason=_health_reason(view),
                restarts=view.restarts,
                retry_at=_wall_clock(view.retry_at)
                if view.retry_at is not None and view.health == "dead"
                else None,
                gateway=self.gateway,
            )
        )

    async def _publish_changes(self) -> None:
        while True:
            changed = True
            try:
                await asyncio.wait_for(self._dirty.wait(), PIN_CHECK_S)
            except TimeoutError:
                changed = False  # Nothing changed, but pins come due to be recorded again.
            self._dirty.clear()
            try:
                await (self._publish() if changed else self._record_pins())
            except Exception as error:
                logger.warning("could not publish the tool registry: %s", error)
                await asyncio.sleep(1.0)
                self._dirty.set()

    async def _publish(self) -> None:
        # Health changes first, in the order they happened; each leaves the queue once stored,
        # so one that failed to publish is tried again, still before any later one.
        while self._health_changes:
            change = self._health_changes[0]
            await self._send(server_health_subject(change.server), change, uuid.uuid4())
            self._health_changes.pop(0)
        # Pins and changes before the registry that lists the tools.
        await self._record_pins()
        registry = registry_event(server.view for server in self.servers.values())
        # A fresh id each time: a registry equal to an earlier one (a breaker closed again)
        # must still become the newest.
        await self._send(TOOL_REGISTRY_SUBJECT, registry, uuid.uuid4())

    async def _record_pins(self) -> None:
        """Record what the servers' listings add to the pins. Each is folded in once the
        stream brings it back: until then it is decided again, with the same id, and the
        stream keeps one."""
        now = datetime.now(UTC)
        for server in self.servers.values():
            pins = self._pins.pins
            for event in decide(pins, server.config.id, server.view.listed, now):
                recorded = pins[event.tool].change if event.tool in pins else None
                if isinstance(event, ToolDefinitionChanged) and event != recorded:
                    logger.warning("MCP tool %s changed since pinned: held", event.tool)
                await self._send(tool_definition_subject(event.tool), event, event_id(event, pins))

    async def _send(self, subject: str, data: Payload, event_id: uuid.UUID) -> None:
        event = new_event(
            data, tenant=TOOLS_TENANT, session_id=TOOLS_SESSION, source=SOURCE, event_id=event_id
        )
        await self._store.publish(subject, event)


def _about_topic(server: str) -> str:
    return f"MCP server {server}"


def _health_reason(view: ServerView) -> str:
    """Why a server is not healthy, in a few words."""
    if view.health == "dead":
        return view.error or "not connected"
    if view.missed_heartbeats:
        return f"unanswered heartbeats in a row: {view.missed_heartbeats}"
    if view.circuit != "closed":
        return f"its circuit is {view.circuit.replace('_', '-')}"
    if view.failures:
        return f"failed calls in a row: {view.failures}"
    return ""


def _describe_health(view: ServerView) -> str:
    """A server's health as `helmline status` shows it: the word first, then the rest."""
    transport = "stdio" if view.config.stdio is not None else "http"
    facts = [transport, f"{len(view.tools)} tools", f"{view.restarts} restarts"]
    line = f"{view.health} ({', '.join(facts)})"
    reason = _health_reason(view)
    if reason:
        line += f": {reason}"
    if view.health == "dead" and view.retry_at is not None:
        line += f"; next try at {_wall_clock(view.retry_at):%H:%M:%S} UTC"
    return line


def _wall_clock(monotonic_s: float) -> datetime:
    """A time of the breakers' monotonic clock as a time of day, for other processes."""
    return datetime.now(UTC) + timedelta(seconds=monotonic_s - time.monotonic())
