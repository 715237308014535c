"""Wiring: the sandbox consumer."""

from __future__ import annotations

from helmline.contracts import SANDBOX_CONSUMER, ConsumerSpec
from helmline.runtime import ServiceHost, Setup
from helmline.sandbox._backends import start_backend
from helmline.sandbox._handlers import SandboxHandler
from helmline.sandbox._limits import Defaults
from helmline.sandbox._settings import SandboxSettings
from helmline.sandbox._snapshots import WorkspaceSnapshots
from helmline.sandbox._tools import Tools


async def tools_for(settings: SandboxSettings) -> Tools:
    """The tools with the backend the settings choose; raises `SandboxUnavailable` if it
    cannot run here."""
    defaults = Defaults(
        cpu_s=settings.default_cpu_s,
        memory_mb=settings.default_memory_mb,
        max_processes=settings.default_max_processes,
        max_file_mb=settings.default_max_file_mb,
    )
    return Tools(await start_backend(settings), defaults)


def sandbox_setup(settings: SandboxSettings, consumer: ConsumerSpec = SANDBOX_CONSUMER) -> Setup:
    """The setup of a sandbox service host, consuming `consumer`."""

    async def setup(host: ServiceHost) -> None:
        tools = await tools_for(settings)
        snapshots = WorkspaceSnapshots(host.js, max_bytes=settings.snapshot_max_mb * 1024 * 1024)
        handler = SandboxHandler(
            host.store, settings.workspaces_dir.resolve(), tools, snapshots=snapshots
        )
        await host.consume(consumer, handler)

    return setup
