"""The sandbox's backends for tests: the process backend, and the container backend on a
private dockerd that these tests start themselves (skipped, with the reason, where none can)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from helmline.sandbox import SandboxSettings, Tools, tools_for
from helmline.sandbox._containers import ContainerBackend
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox.testing import EngineUnavailable, PrivateDockerd


@pytest.fixture(scope="session")
def dockerd() -> Iterator[PrivateDockerd]:
    """A private Docker engine with the busybox image imported."""
    try:
        with PrivateDockerd() as engine:
            engine.import_busybox()
            yield engine
    except EngineUnavailable as error:
        pytest.skip(f"no container engine: {error}")


CONTAINER_PROFILE = SandboxProfile(backend="container", image="helmline-test/busybox:latest",
                                   granted_network="host")  # fmt: skip
"""Containers of the test image; a granted network is the host's, so that a test can reach
a listener on the host's loopback (the private engine has no bridge)."""


@pytest.fixture(
    scope="module", params=["process", pytest.param("container", marks=pytest.mark.container)]
)
async def tools(request: pytest.FixtureRequest) -> AsyncIterator[Tools]:
    """The built-in tools with commands run by each backend in turn."""
    settings = SandboxSettings()
    process = await tools_for(settings)
    if request.param == "process":
        yield process
        return
    engine: PrivateDockerd = request.getfixturevalue("dockerd")
    backend = await ContainerBackend.start(engine.client(), CONTAINER_PROFILE, settings)
    yield Tools(backend, process.defaults)
    await backend.close()
