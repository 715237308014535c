"""The tool registry as gateways publish it, for the services and tools that read it."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    TOOL_REGISTRY_SUBJECT,
    TOOLS_STREAM,
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
