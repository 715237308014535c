"""Watching a running call's cgroup counters: stop it at a limit the kernel only counts, and
warn of limits it comes near. Shared by every backend whose calls have cgroups to read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from helmline.contracts import LimitHit, ResourceUsage
from helmline.sandbox._cgroups import Usage
from helmline.sandbox._commands import Approached
from helmline.sandbox._limits import LimitName, Limits, NearLimits

WATCH_INTERVAL_S = 0.05


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
