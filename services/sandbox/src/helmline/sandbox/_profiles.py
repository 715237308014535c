"""Sandbox profiles: named ways to run calls (backend, image, limits, parts of the workspace
kept from them), chosen by policy per tool and tenant; the request names one, the service's
configuration defines them."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from helmline.confinement import Destination, checked_destinations
from helmline.sandbox._limits import Defaults
from helmline.sandbox._paths import PathRules, rule_path


class SandboxProfile(BaseModel):
    """How commands of calls granted this profile run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["process", "container"] = "process"
    """`process`: bubblewrap with cgroups and rlimits; `container`: a container through the
    Docker Engine API (Docker, or Podman's compatible socket)."""
    image: str | None = None
    """The container image (container backend only; must already be in the engine)."""
    cpus: float | None = Field(default=None, gt=0)
    """CPUs' worth of time a call may use at once (`0.5`: half of one); None: the service's
    `default_cpus`."""
    egress: tuple[str, ...] = ()
    """`host:port`s (host names, or loopback addresses 127.x.x.x) the commands of calls
    granted a network reach, and nothing else: each runs in a network namespace of its own,
    through the egress proxy of `helmline.confinement`, every other connection refused and
    named on the call's result (`egress_refused`). Empty: a call granted a network has the
    host's (process backend). A call granted none has none either way."""
    granted_network: str = "bridge"
    """The engine network a container joins when its call is granted a network (container
    backend); without a grant it has none."""
    cpu_s: float | None = Field(default=None, gt=0)
    """CPU seconds of a call whose request sets none (else the service's default)."""
    memory_mb: int | None = Field(default=None, gt=0)
    """Memory (MiB) of a call whose request sets none."""
    max_processes: int | None = Field(default=None, gt=0)
    """Processes a call may have at once, when its request sets none."""
    max_file_mb: int | None = Field(default=None, gt=0)
    """Largest file (MiB) a call may write, when its request sets none."""
    disk_mb: int | None = Field(default=None, gt=0)
    """What the session's workspace may hold (MiB) after the profile's calls."""
    read_only_paths: tuple[str, ...] = ()
    """Workspace-relative paths (`config`, `src/vendor`) calls may read and not change: the
    file tools refuse to, and a command sees them mounted read-only (process backend)."""
    blocked_paths: tuple[str, ...] = ()
    """Workspace-relative paths (`.env`, `secrets`) calls may neither read nor change: the
    file tools refuse them and leave them out of listings, and a command sees an empty,
    read-only folder or file in their place (process backend)."""

    @field_validator("egress")
    @classmethod
    def _destinations(cls, egress: tuple[str, ...]) -> tuple[str, ...]:
        return checked_destinations(egress, "egress")

    @field_validator("read_only_paths", "blocked_paths")
    @classmethod
    def _workspace_relative(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(str(rule_path(path)) for path in paths)

    @model_validator(mode="after")
    def _container_needs_an_image(self) -> SandboxProfile:
        if self.backend == "container" and not self.image:
            raise ValueError("a container profile needs an image")
        if self.backend == "process" and self.image:
            raise ValueError("an image applies to the container backend only")
        if self.backend == "container" and (self.read_only_paths or self.blocked_paths):
            raise ValueError("read_only_paths and blocked_paths apply to the process backend only")
        if self.backend == "container" and self.egress:
            raise ValueError("egress applies to the process backend only")
        if both := set(self.read_only_paths) & set(self.blocked_paths):
            raise ValueError(f"{', '.join(sorted(both))}: both read-only and blocked; choose one")
        return self

    @property
    def path_rules(self) -> PathRules:
        """What the profile keeps of the workspace from its calls."""
        return PathRules(
            read_only=tuple(PurePosixPath(path) for path in self.read_only_paths),
            blocked=tuple(PurePosixPath(path) for path in self.blocked_paths),
        )

    @property
    def destinations(self) -> tuple[Destination, ...]:
        """Where calls granted a network may connect (none named: anywhere)."""
        return tuple(Destination.parse(text) for text in self.egress)

    def defaults_over(self, service: Defaults) -> Defaults:
        """The limits of a call that sets none: the profile's, else the service's."""
        return Defaults(
            cpu_s=self.cpu_s or service.cpu_s,
            memory_mb=self.memory_mb or service.memory_mb,
            max_processes=self.max_processes or service.max_processes,
            max_file_mb=self.max_file_mb or service.max_file_mb,
            cpus=self.cpus or service.cpus,
            disk_mb=self.disk_mb or service.disk_mb,
        )
