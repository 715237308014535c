"""Which limits a call runs under, and which one stopped it. Pure."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Literal

from helmline.contracts import SandboxLimits

LimitName = Literal["timeout", "cpu", "memory", "processes", "file_size", "output", "disk"]

MIB = 1024 * 1024
WARNING_FRACTION = 0.9
"""Share of a limit past which a running call is reported as approaching it."""
_SIGNALLED = 128
"""A shell reports a child killed by signal N as exit status 128 + N."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Every limit of one call, each with a value (the request's, else the service's)."""

    timeout_s: float
    cpu_s: float
    memory_mb: int
    max_processes: int
    max_file_mb: int
    max_output_bytes: int
    cpus: float | None = None
    """CPUs' worth of time the command may use at once; None: no cap."""
    disk_mb: int | None = None
    """What the session's workspace may hold (MiB); None: no quota."""

    def value_of(self, limit: LimitName) -> float:
        """The configured value of a limit, as `LimitHit.value` reports it."""
        match limit:
            case "timeout":
                return self.timeout_s
            case "cpu":
                return self.cpu_s
            case "memory":
                return self.memory_mb
            case "processes":
                return self.max_processes
            case "file_size":
                return self.max_file_mb
            case "output":
                return self.max_output_bytes
            case "disk":
                return self.disk_mb if self.disk_mb is not None else float("inf")


@dataclass(slots=True)
class NearLimits:
    """Which limits of a running call it has come near, so each is reported once."""

    limits: Limits
    warned: set[LimitName] = field(default_factory=set)

    def crossing(self, limit: LimitName, used: float) -> bool:
        """Whether `used` has just passed 90 % of `limit` (true once per limit)."""
        if limit in self.warned:
            return False
        if used < WARNING_FRACTION * self.limits.value_of(limit):
            return False
        self.warned.add(limit)
        return True


@dataclass(frozen=True, slots=True)
class Defaults:
    """The service's limits for what a request leaves unset."""

    cpu_s: float
    memory_mb: int
    max_processes: int
    max_file_mb: int
    cpus: float | None = None
    disk_mb: int | None = None


def effective_limits(requested: SandboxLimits, timeout_s: float, defaults: Defaults) -> Limits:
    """The request's limits with the service's defaults filled in."""
    return Limits(
        timeout_s=timeout_s,
        cpu_s=requested.cpu_s if requested.cpu_s is not None else defaults.cpu_s,
        memory_mb=requested.memory_mb if requested.memory_mb is not None else defaults.memory_mb,
        max_processes=requested.max_processes
        if requested.max_processes is not None
        else defaults.max_processes,
        max_file_mb=requested.max_file_mb
        if requested.max_file_mb is not None
        else defaults.max_file_mb,
        max_output_bytes=requested.max_output_bytes,
        cpus=defaults.cpus,
        disk_mb=defaults.disk_mb,
    )


@dataclass(frozen=True, slots=True)
class Observed:
    """What the kernel said about a command that exited by itself."""

    exit_code: int | None
    """The shell's exit status."""
    oom_kills: int = 0
    """Processes the memory controller killed."""
    forks_refused: int = 0
    """Forks the pids controller refused."""
    cpu_s: float | None = None
    """CPU time of every process of the call, where measured."""


def limit_that_stopped(observed: Observed, limits: Limits) -> LimitName | None:
    """The limit that ended a command which exited by itself, if one did.

    A command may survive a limit (a shell reports its killed child and carries on), so
    the kernel's counters decide where they exist, and the signal behind the exit status
    where they do not.
    """
    code = observed.exit_code
    if observed.oom_kills:
        return "memory"
    if code == _SIGNALLED + signal.SIGXCPU:
        return "cpu"
    if (
        code == _SIGNALLED + signal.SIGKILL
        and observed.cpu_s is not None
        and observed.cpu_s >= limits.cpu_s
    ):
        return "cpu"  # Past the soft CPU limit the kernel sends SIGKILL at the hard one.
    if code == _SIGNALLED + signal.SIGXFSZ:
        return "file_size"
    if observed.forks_refused:
        return "processes"  # A refused fork breaks a command even when its shell exits 0.
    return None
