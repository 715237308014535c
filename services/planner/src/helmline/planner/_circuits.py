"""The circuit breakers of the federated MCP servers, as the tool gateway announces them."""

from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from helmline.contracts import ALL_CIRCUITS, ToolCircuitChanged, UndecodableEvent, decode_event

logger = logging.getLogger(__name__)


class CircuitWatch:
    """The newest `tool.circuit.changed` of each server: the last one stored at start, then
    each one as it is published."""

    def __init__(self) -> None:
        self._latest: dict[str, ToolCircuitChanged] = {}
        self._subscription: Subscription | None = None

    def of(self, server: str) -> ToolCircuitChanged | None:
        """The server's breaker as last announced; None if it never changed."""
        return self._latest.get(server)

    async def follow(self, js: JetStreamContext) -> None:
        """Read each server's newest change, then keep up with new ones."""

        async def changed(message: Msg) -> None:
            try:
                change = decode_event(message.data).data
            except UndecodableEvent as error:
                logger.warning("ignoring an undecodable circuit change: %s", error)
                return
            if isinstance(change, ToolCircuitChanged):
                self._latest[change.server] = change

        # One ordered consumer does both, in order: the last change of each server, then live.
        self._subscription = await js.subscribe(
            ALL_CIRCUITS,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            cb=changed,
        )

    async def close(self) -> None:
        """Stop following."""
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
