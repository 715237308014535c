"""The tool gateway's edge: authorised calls in, results or sandbox requests out."""

from __future__ import annotations

from helmline.contracts import ToolCallAuthorized
from helmline.runtime import Delivery, EventStore
from helmline.tool_gateway._calls import route

SOURCE = "helmline/tool-gateway"


class GatewayHandler:
    """Validates each authorised call and routes it to its executor."""

    def __init__(self, store: EventStore) -> None:
        self._store = store

    async def __call__(self, delivery: Delivery) -> None:
        call = delivery.event.data
        if not isinstance(call, ToolCallAuthorized):
            return
        # Same cause, same derived id: a redelivered call is stored once, never run twice
        # by the gateway; the sandbox checks the log before running anything again.
        await self._store.append(delivery.event.derive(route(call), source=SOURCE))
