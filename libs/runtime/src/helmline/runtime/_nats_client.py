"""How every Helmline process connects to NATS: nats-py's client, minus two socket leaks.

nats-py (2.16) reuses one transport object for every connection attempt and opens each
new connection over the last without closing it, so a reconnection whose handshake fails
(a restarting server that accepts before it answers, a cluster node coming back) leaves
that socket open; and a first connection that fails is left open unless the client is
closed. Left open, a socket is only found when it is collected, as a ResourceWarning.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client
from nats.aio.client import Srv as Server


class NatsClient(Client):
    """A nats-py client that closes a connection before it opens the next."""

    async def _connect_to_server(self, s: Server) -> None:
        if self._transport is not None:
            self._transport.close()  # type: ignore[no-untyped-call]
        await super()._connect_to_server(s)


async def connect_nats(servers: str | list[str], **options: Any) -> NatsClient:
    """Connect as `nats.connect` does (same options); a connection that fails is closed."""
    client = NatsClient()
    try:
        await client.connect(servers, **options)
    except BaseException:
        await client.close()
        raise
    return client
