"""Helpers for testing code that runs on Helmline's event log, against a real nats-server.

Other teams can use them too: start a throwaway JetStream server, wait on conditions.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from helmline.runtime._embedded import nats_server_binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NatsServer:
    """A nats-server with JetStream on a free port, storing under `store_dir`, for tests."""

    def __init__(self, store_dir: Path, port: int | None = None) -> None:
        self.store_dir = store_dir
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where clients connect."""
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it accepts connections."""
        with (self.store_dir / "nats-server.log").open("ab") as log:
            self._process = subprocess.Popen(
                [
                    str(nats_server_binary()),
                    "-js",
                    "-sd",
                    str(self.store_dir),
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"nats-server exited: see {self.store_dir}/nats-server.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


async def eventually(
    check: Callable[[], Any],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    what: str = "condition",
) -> Any:
    """Wait until `check` returns something truthy and return it; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not hold within {timeout_s} s")
        await asyncio.sleep(interval_s)
