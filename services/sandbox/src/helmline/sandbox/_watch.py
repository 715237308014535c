"""Watching a running call's cgroup counters and its workspace: stop it at a limit the kernel
only counts (or does not know, as the workspace's quota), and warn of limits it comes near.
Shared by every backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from helmline.contracts import LimitHit, ResourceUsage
from helmline.sandbox._cgroups import Usage
from helmline.sandbox._commands import Approached
from helmline.sandbox._files import workspace_bytes
from helmline.sandbox._limits import MIB, LimitName, Limits, NearLimits

WATCH_INTERVAL_S = 0.05
DISK_WATCH_INTERVAL_S = 0.5
"""Measuring a workspace walks it, so less often than the counters are read..."""
_DISK_WATCH_SHARE = 0.1
"""...and, for a workspace of many files, at most this share of the time."""


def resource_usage(wall_ms: float, usage: Usage) -> ResourceUsage:
    """What a call used, as events report it."""
    return ResourceUsage(
        wall_ms=wall_ms,
        cpu_ms=usage.cpu_s * 1000 if usage.cpu_s is not None else None,
        peak_memory_mb=usage.peak_memory_mb,
    )


async def watch_limits(
    read: Callable[[], Usage],
    limits: Limits,
    command: str,
    approached: Approached,
    *,
    not_the_commands: int,
) -> LimitName:
    """Return the limit a call crossed, once its counters show it; warn on the way.

    The kernel enforces; this only notices, so a call that met a limit ends now instead of
    at its wall-clock limit (a fork bomb refused forks forever). `not_the_commands` is how
    many processes of the cgroup belong to the sandbox rather than the command.
    """
    near = NearLimits(limits)
    began = time.monotonic()
    while True:
        await asyncio.sleep(WATCH_INTERVAL_S)
        usage = read()
        if usage.oom_kills:
            return "memory"
        if usage.forks_refused:
            return "processes"
        if usage.cpu_s is not None and usage.cpu_s >= limits.cpu_s:
            return "cpu"
        wall_s = time.monotonic() - began
        processes = (
            max(usage.processes - not_the_commands, 0) if usage.processes is not None else None
        )
        measured: tuple[tuple[LimitName, float | None], ...] = (
            ("memory", usage.peak_memory_mb),
            ("cpu", usage.cpu_s),
            ("processes", processes),
            ("timeout", wall_s),
        )
        for limit, used in measured:
            if used is not None and near.crossing(limit, used):
                hit = LimitHit(limit=limit, value=limits.value_of(limit), command=command)
                approached(hit, used, resource_usage(wall_s * 1000, usage))


async def watch_disk(
    workspace: Path, allowed: int, limits: Limits, command: str, approached: Approached
) -> LimitName:
    """Return `disk` once the workspace takes more than `allowed` bytes; warn at 90 %."""
    near = NearLimits(limits)
    began = time.monotonic()
    interval_s = DISK_WATCH_INTERVAL_S
    while True:
        await asyncio.sleep(interval_s)
        walk_began = time.monotonic()
        held = await asyncio.to_thread(workspace_bytes, workspace)
        walked_s = time.monotonic() - walk_began
        interval_s = max(DISK_WATCH_INTERVAL_S, walked_s / _DISK_WATCH_SHARE)
        if held > allowed:
            return "disk"
        if limits.disk_mb is not None and near.crossing("disk", held / MIB):
            hit = LimitHit(limit="disk", value=limits.disk_mb, command=command)
            approached(hit, held / MIB, ResourceUsage(wall_ms=(time.monotonic() - began) * 1000))


async def first_limit(*watches: Awaitable[LimitName]) -> LimitName:
    """The limit the first of `watches` to return saw crossed; the others are stopped."""
    running = [asyncio.ensure_future(watch) for watch in watches]
    try:
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        return done.pop().result()
    finally:
        for watch in running:
            watch.cancel()
