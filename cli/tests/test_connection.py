"""How a command reaches the event log when it is not there, or does not answer."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from typer.testing import CliRunner

from helmline.cli import app
from helmline.runtime.testing import free_port


def test_a_command_fails_fast_and_clearly_when_nats_is_not_there() -> None:
    # In a process of its own: a command that hung would otherwise hang the suite.
    url = f"nats://helmline:hunter2@127.0.0.1:{free_port()}"
    ran = subprocess.run(
        [sys.executable, "-m", "helmline.cli", "keys", "list"],
        env={**os.environ, "HELMLINE_NATS_URL": url},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ran.returncode == 1, ran.stderr
    assert "cannot reach NATS at nats://127.0.0.1:" in ran.stderr
    assert "hunter2" not in ran.stdout + ran.stderr


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never says a word (a hung or foreign server);
    its port."""
    accepted: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda _, writer: accepted.append(writer), "127.0.0.1")
    yield server.sockets[0].getsockname()[1]
    server.close()
    for writer in accepted:
        writer.close()
    await server.wait_closed()


async def test_a_server_that_never_answers_is_an_error_and_leaves_no_connection_open(
    silent_server: int,
) -> None:
    url = f"nats://127.0.0.1:{silent_server}"
    ran = await asyncio.to_thread(
        CliRunner().invoke, app, ["keys", "list"], env={"HELMLINE_NATS_URL": url}
    )
    assert ran.exit_code == 1, ran.output
    assert f"cannot reach NATS at {url}" in ran.output
    # nats-py leaves the socket of a failed handshake open unless told to close; a leaked
    # one is reported here, as an unraisable ResourceWarning that fails the test.
    gc.collect()
