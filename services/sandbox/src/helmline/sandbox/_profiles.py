"""Sandbox profiles: named ways to run commands (backend, image, limits), chosen by policy per
tool and tenant; the request names one, the service's configuration defines them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from helmline.sandbox._limits import Defaults


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

    @model_validator(mode="after")
    def _container_needs_an_image(self) -> SandboxProfile:
        if self.backend == "container" and not self.image:
            raise ValueError("a container profile needs an image")
        if self.backend == "process" and self.image:
            raise ValueError("an image applies to the container backend only")
        return self

    def defaults_over(self, service: Defaults) -> Defaults:
        """The limits of a call that sets none: the profile's, else the service's."""
        return Defaults(
            cpu_s=self.cpu_s or service.cpu_s,
            memory_mb=self.memory_mb or service.memory_mb,
            max_processes=self.max_processes or service.max_processes,
            max_file_mb=self.max_file_mb or service.max_file_mb,
            cpus=self.cpus or service.cpus,
        )
