"""Every service as its own process against the test nats-server, for end-to-end tests."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from helmline.runtime.testing import ServiceProcesses

SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
HELMLINE = str(Path(sys.executable).with_name("helmline"))

Helmline = Callable[..., Awaitable[tuple[int, str, str]]]
"""Runs `helmline ARGS...` against the test nats-server: exit status, stdout, stderr."""


@pytest.fixture(scope="module")
def services(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcesses]:
    running = ServiceProcesses(nats_url, tmp_path_factory.mktemp("stack"))
    try:
        for name in SERVICES:
            running.start(name)
        yield running
    finally:
        running.stop_all()


@pytest.fixture
def helmline(nats_url: str) -> Helmline:
    """The `helmline` command as a person runs it, talking to the test nats-server."""
    return helmline_at(nats_url)


def helmline_at(nats_url: str, **env: str) -> Helmline:
    """The `helmline` command talking to the nats-server at `nats_url` (`env`: more of its
    environment)."""

    async def run(*args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            HELMLINE,
            *args,
            env={"HELMLINE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin", **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    return run
