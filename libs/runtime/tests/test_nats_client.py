"""Connections that fail leave nothing open: a server that accepts and never answers (one
restarting, or a cluster node coming back) is the case nats-py gets wrong."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from helmline.runtime import connect_nats
from helmline.runtime.testing import NatsServer, eventually, free_port


class SilentServer:
    """A TCP port that accepts connections and never says a word."""

    def __init__(self) -> None:
        self.accepted: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def listen(self, port: int) -> None:
        # The port was a nats-server's a moment ago: binding may take a few tries.
        async def bound() -> bool:
            try:
                self._server = await asyncio.start_server(
                    lambda _, writer: self.accepted.append(writer), "127.0.0.1", port
                )
            except OSError:
                return False
            return True

        await eventually(bound, timeout_s=10)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in self.accepted:
            writer.close()
        await self._server.wait_closed()


@pytest.fixture
async def silent() -> AsyncIterator[SilentServer]:
    server = SilentServer()
    yield server
    await server.close()


async def test_reconnecting_through_a_silent_server_leaves_no_connection_open(
    tmp_path: Path, silent: SilentServer
) -> None:
    port = free_port()
    server = NatsServer(tmp_path, port)
    server.start()
    connection = await connect_nats(
        f"nats://127.0.0.1:{port}",
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        connect_timeout=0.3,
    )
    try:
        server.stop()
        await silent.listen(port)
        # Three handshakes that time out, each on a connection of its own.
        await eventually(lambda: len(silent.accepted) >= 3, timeout_s=10, what="reconnections")
        await silent.close()
        server.start()
        await eventually(lambda: connection.is_connected, timeout_s=20)
    finally:
        await connection.close()
        server.stop()
    # A connection dropped open is reported here, as an unraisable ResourceWarning that
    # fails the test (nats-py 2.16 left one per failed handshake).
    gc.collect()
