"""The tool registry as gateways publish it, for the services and tools that read it."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator, Mapping

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from helmline.contracts import (
    ALL_MCP_INSTANCES,
    BUILTIN_TOOLS_BY_NAME,
    TOOL_REGISTRY_SUBJECT,
    TOOLS_STREAM,
    McpInstanceStarted,
    McpInstanceStopped,
    ToolRegistryPublished,
    ToolSpec,
    UndecodableEvent,
    decode_event,
)

logger = logging.getLogger(__name__)


async def latest_tool_registry(js: JetStreamContext) -> ToolRegistryPublished | None:
    """The newest registry a gateway published, or None if none has yet."""
    try:
        message = await js.get_last_msg(TOOLS_STREAM.name, TOOL_REGISTRY_SUBJECT)
    except NotFoundError:
        return None
    assert message.data is not None
    registry = decode_event(message.data).data
    return registry if isinstance(registry, ToolRegistryPublished) else None


async def running_instances(js: JetStreamContext, timeout_s: float = 10.0) -> Counter[str]:
    """How many instances of each MCP server isolated per tenant or session run now, by
    server: those whose latest `mcp.instance.*` record says started. Reads one record per
    tenant or session that ever had an instance (the latest on its subject), not their
    history."""
    try:
        last = (await js.get_last_msg(TOOLS_STREAM.name, ALL_MCP_INSTANCES)).seq or 0
    except NotFoundError:
        return Counter()
    latest: dict[str, tuple[str, bool]] = {}
    """The server and whether it runs, of the latest record on each subject."""
    caught_up = asyncio.Event()

    async def record(message: Msg) -> None:
        try:
            event = decode_event(message.data)
        except UndecodableEvent as error:
            logger.warning("ignoring an undecodable MCP instance record: %s", error)
        else:
            if isinstance(event.data, McpInstanceStarted | McpInstanceStopped):
                running = isinstance(event.data, McpInstanceStarted)
                latest[message.subject] = (event.data.instance.server, running)
        if message.metadata.num_pending == 0 or message.metadata.sequence.stream >= last:
            caught_up.set()

    subscription = await js.subscribe(
        ALL_MCP_INSTANCES,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        cb=record,
    )
    try:
        await asyncio.wait_for(caught_up.wait(), timeout_s)
    finally:
        await subscription.unsubscribe()
    return Counter(server for server, running in latest.values() if running)


class ToolCatalogue(Mapping[str, ToolSpec]):
    """The tools that may be called now, by name: the built-in ones until a gateway publishes
    its registry, then the newest registry's, kept up to date while `follow` runs."""

    def __init__(self) -> None:
        self._tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME
        self.registry: ToolRegistryPublished | None = None
        self._subscription: Subscription | None = None

    def __getitem__(self, name: str) -> ToolSpec:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def apply(self, registry: ToolRegistryPublished) -> None:
        """Take a published registry as the one in force."""
        self.registry = registry
        self._tools = {**BUILTIN_TOOLS_BY_NAME, **{tool.name: tool for tool in registry.tools}}

    async def follow(self, nc: NATS, js: JetStreamContext) -> None:
        """Take the newest registry now, and every one published from now on."""

        async def published(message: Msg) -> None:
            try:
                event = decode_event(message.data)
            except UndecodableEvent as error:
                logger.warning("ignoring an undecodable tool registry: %s", error)
                return
            if isinstance(event.data, ToolRegistryPublished):
                self.apply(event.data)

        # Subscribe first, then read the newest: a registry published in between is not lost.
        self._subscription = await nc.subscribe(TOOL_REGISTRY_SUBJECT, cb=published)
        latest = await latest_tool_registry(js)
        if latest is not None and self.registry is None:
            self.apply(latest)

    async def close(self) -> None:
        """Stop following."""
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None


def tools_of(registry: ToolRegistryPublished | None) -> Mapping[str, ToolSpec]:
    """The tools a registry the gateways published makes callable, or the built-in tools
    when none was published."""
    catalogue = ToolCatalogue()
    if registry is not None:
        catalogue.apply(registry)
    return catalogue
