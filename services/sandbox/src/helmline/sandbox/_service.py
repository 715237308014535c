"""Wiring: the sandbox consumer."""

from __future__ import annotations

from helmline.contracts import SANDBOX_CONSUMER, ConsumerSpec
from helmline.runtime import ServiceHost, Setup
from helmline.sandbox._handlers import SandboxHandler
from helmline.sandbox._settings import SandboxSettings


def sandbox_setup(settings: SandboxSettings, consumer: ConsumerSpec = SANDBOX_CONSUMER) -> Setup:
    """The setup of a sandbox service host, consuming `consumer`."""

    async def setup(host: ServiceHost) -> None:
        handler = SandboxHandler(host.store, settings.workspaces_dir.resolve())
        await host.consume(consumer, handler)

    return setup
