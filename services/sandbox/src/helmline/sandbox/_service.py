"""Wiring: the backends of the configured profiles, and the sandbox consumer."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from helmline.contracts import (
    SANDBOX_CONSUMER,
    ConsumerSpec,
    SessionCancelRequested,
    event_type_filter,
    parse_event_subject,
)
from helmline.runtime import FoldedStates, InjectionClassifier, ServiceHost, Setup
from helmline.sandbox._backends import CommandBackend, ProcessBackend, start_backend
from helmline.sandbox._containers import ContainerBackend, connect
from helmline.sandbox._handlers import SandboxHandler
from helmline.sandbox._limits import Defaults
from helmline.sandbox._reclaim import (
    own_workspaces_dir,
    remove_half_removed,
    sweep_workspace_folders,
)
from helmline.sandbox._settings import SandboxSettings
from helmline.sandbox._snapshots import WorkspaceSnapshots
from helmline.sandbox._sweep import WorkspaceSweep
from helmline.sandbox._tools import Sandboxed, Tools


async def tools_for(settings: SandboxSettings) -> Tools:
    """The tools with the backend the settings choose and one per configured profile;
    raises `SandboxUnavailable` if any of them cannot run here."""
    defaults = Defaults(
        cpu_s=settings.default_cpu_s,
        memory_mb=settings.default_memory_mb,
        max_processes=settings.default_max_processes,
        max_file_mb=settings.default_max_file_mb,
        cpus=settings.default_cpus,
        disk_mb=settings.default_disk_mb,
    )
    backend = await start_backend(settings)
    process = backend if isinstance(backend, ProcessBackend) else None
    profiles: dict[str, Sandboxed] = {}
    for name, profile in settings.sandbox_profiles.items():
        chosen: CommandBackend
        match profile.backend:
            case "process":
                process = process or await ProcessBackend.start(settings)
                chosen = process
            case "container":
                client = await asyncio.to_thread(connect, settings.docker_host)
                chosen = await ContainerBackend.start(client, profile, settings)
        profiles[name] = Sandboxed(
            chosen, profile.defaults_over(defaults), profile.path_rules, profile.destinations
        )
    return Tools(backend, defaults, profiles)


def sandbox_setup(settings: SandboxSettings, consumer: ConsumerSpec = SANDBOX_CONSUMER) -> Setup:
    """The setup of a sandbox service host, consuming `consumer`."""

    async def setup(host: ServiceHost) -> None:
        tools = await tools_for(settings)
        host.on_shutdown(tools.close)
        host.about.update(tools.describe())
        snapshots = WorkspaceSnapshots(host.js, max_bytes=settings.snapshot_max_mb * 1024 * 1024)
        workspaces_dir = settings.workspaces_dir.resolve()
        classifier = InjectionClassifier.from_settings(settings)
        if classifier is not None:
            host.on_shutdown(classifier.aclose)
        handler = SandboxHandler(
            host.store,
            workspaces_dir,
            tools,
            snapshots=snapshots,
            reclaim=settings.reclaim_workspaces,
            secrets=host.secrets,
            classifier=classifier,
            states=FoldedStates(host.js, host.store),
        )
        await asyncio.to_thread(own_workspaces_dir, workspaces_dir)
        await asyncio.to_thread(remove_half_removed, workspaces_dir)
        await host.consume(consumer, handler)
        host.sweep_regularly("workspace snapshots", WorkspaceSweep(host.js, host.store))
        host.sweep_regularly(
            "workspace folders",
            lambda: sweep_workspace_folders(host.store, workspaces_dir, handler.runs_a_call),
        )

        async def cancelled(message: Msg) -> None:
            # The consumer hands a cancel to one replica, but the session's commands may
            # run on any: every replica hears it as it is stored.
            with contextlib.suppress(ValueError):
                parts = parse_event_subject(message.subject)
                handler.cancel_session(parts.tenant, parts.session_id)

        await host.nc.subscribe(event_type_filter(SessionCancelRequested.TYPE), cb=cancelled)

    return setup
