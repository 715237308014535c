"""Every service as its own process against the test nats-server, for end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helmline.runtime.testing import ServiceProcesses

SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")


@pytest.fixture(scope="module")
def services(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcesses]:
    running = ServiceProcesses(nats_url, tmp_path_factory.mktemp("stack"))
    try:
        for name in SERVICES:
            running.start(name)
        yield running
    finally:
        running.stop_all()
