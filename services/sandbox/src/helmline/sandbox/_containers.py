"""The container backend: `run_command` in a container, through the Docker Engine API (Docker,
or Podman's compatible socket), with the process backend's contract.

Each container has a read-only root, no network unless the call is granted one, no
capabilities, no-new-privileges, a private /tmp, the session workspace as its only writable
folder, memory, process and CPU quotas, rlimits for CPU time and file size, and runs the
command as the session's unprivileged uid. Starting a container costs far more than running
a command in one, so a session's container is kept warm between its calls (one per set of
limits) and each command is an `exec` into it; after every call everything the command left
(processes, /tmp) is removed, so calls stay as separate as fresh containers. The container's
own process runs as another uid that the command cannot signal; it ends by itself within an
hour, so a sandbox that dies never leaves containers behind for long.

Where the engine runs on this host (the usual case), the container's cgroups are read here:
usage, limits the kernel only counts (a CPU budget across processes, refused forks, OOM
kills) and 90 % warnings work as in the process backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
from docker.models.containers import Container
from docker.types import Mount, Ulimit
from docker.utils.socket import frames_iter

from helmline.contracts import ToolError
from helmline.sandbox._backends import (
    CommandJob,
    CommandResult,
    prepare_workspace,
    session_owner,
    watch_disk_of,
)
from helmline.sandbox._cgroups import CallCgroups, Usage, alive
from helmline.sandbox._commands import (
    MARKER_VARIABLE,
    CommandControl,
    CommandRun,
    Output,
    Reaper,
    how_it_ends,
)
from helmline.sandbox._confinement import ENVIRONMENT, SHELL, WORKSPACE_MOUNT
from helmline.sandbox._errors import SandboxUnavailable, ToolRefused
from helmline.sandbox._limits import LimitName, Limits, Observed, limit_that_stopped
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._settings import SandboxSettings
from helmline.sandbox._watch import first_limit, resource_usage, watch_limits

logger = logging.getLogger(__name__)

LABEL = "helmline.sandbox"
"""Marks the containers this backend starts."""
_KEEPER = ["sleep", "3600"]
"""The container's own process: it only keeps the container up, for an hour at most."""
_KEEPER_USER = "65534:65534"
"""nobody: not any session's uid, so no command can signal the keeper."""
_KEEPER_PROCESSES = 2
"""The engine's init and the keeper, counted by the pids limit besides the command."""
_REUSE_FOR_S = 3000.0
"""Age past which a warm container is not used again (its keeper ends at 3600 s)."""
_IDLE_S = 60.0
"""How long a warm container waits for its session's next call before it is removed."""
_DRAIN_S = 2.0
_CLEAN = "kill -9 -1; rm -rf /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null; exit 0"
"""Run as the command's uid when the container is not visible from here: `kill -1` signals
every process that uid may signal except the shell itself (and never the keeper)."""


@dataclass(frozen=True, slots=True)
class _Key:
    """What a warm container was made for; a call with another key needs another one."""

    workspace: Path
    uid: int
    limits: tuple[int, int, float, int, float | None]
    """memory_mb, max_processes, cpu_s, max_file_mb, cpus."""
    network: bool


@dataclass(slots=True)
class _Warm:
    """A running container ready for a command."""

    container: Container
    cgroups: CallCgroups
    """Its cgroups, when visible from here (empty otherwise)."""
    root: Path | None
    """Its root filesystem as seen from here (through its keeper's /proc entry)."""
    keepers: frozenset[int]
    """Host pids of its init and keeper."""
    created: float = field(default_factory=time.monotonic)
    idle_since: float = field(default_factory=time.monotonic)


def connect(docker_host: str | None) -> docker.DockerClient:
    """A client of the engine, checked to answer; raises `SandboxUnavailable`. Blocking."""
    try:
        client = (
            docker.DockerClient(base_url=docker_host, version="auto")
            if docker_host
            else docker.from_env(version="auto")
        )
        client.ping()
    except docker.errors.DockerException as error:
        raise SandboxUnavailable(
            f"no container engine answers at {docker_host or 'DOCKER_HOST or the default socket'}:"
            f" {error}. Start Docker (or Podman's socket), or set HELMLINE_DOCKER_HOST"
        ) from error
    return client


class ContainerBackend:
    """Commands in containers of one profile's image."""

    def __init__(
        self, client: docker.DockerClient, profile: SandboxProfile, settings: SandboxSettings
    ) -> None:
        assert profile.image is not None
        self._client = client
        self._image = profile.image
        self._profile = profile
        self._settings = settings
        self._idle: dict[_Key, list[_Warm]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def describe(self) -> str:
        engine = self._settings.docker_host or "Docker's default engine"
        return f"containers of image {self._image} on {engine}"

    @classmethod
    async def start(
        cls, client: docker.DockerClient, profile: SandboxProfile, settings: SandboxSettings
    ) -> ContainerBackend:
        """The backend, once its image is found and has run `true`; raises
        `SandboxUnavailable`, saying what is missing, otherwise. It owns `client` from now on."""
        assert profile.image is not None
        try:
            await asyncio.to_thread(client.images.get, profile.image)
        except docker.errors.ImageNotFound as error:
            raise SandboxUnavailable(
                f"the container image {profile.image!r} is not in the engine: pull, load or "
                "import it first (commands never wait for a download)"
            ) from error
        backend = cls(client, profile, settings)
        with tempfile.TemporaryDirectory(prefix="helmline-probe-") as folder:
            result = await backend.run(
                CommandJob(
                    command="true",
                    workspace=Path(folder) / "workspace",
                    tenant="probe",
                    session_id="probe",
                    limits=Limits(30.0, 10.0, 64, 16, 1, 4096),
                    network=False,
                ),
                CommandControl(f"probe-{os.getpid()}", asyncio.Event(), Reaper()),
            )
        await backend._remove_warm()
        if result.run.exit_code != 0:
            raise SandboxUnavailable(
                f"image {profile.image!r} cannot run `true` (exit {result.run.exit_code}): "
                f"{bytes(result.run.output.kept[2]).decode(errors='replace').strip()}"
            )
        return backend

    def workspace_owner(self, tenant: str, session_id: str) -> int | None:
        return session_owner(self._settings, tenant, session_id)

    async def run(self, job: CommandJob, control: CommandControl) -> CommandResult:
        limits = job.limits
        owner = self.workspace_owner(job.tenant, job.session_id)
        uid = owner if owner is not None else os.getuid()
        key = _Key(
            job.workspace,
            uid,
            (
                limits.memory_mb,
                limits.max_processes,
                limits.cpu_s,
                limits.max_file_mb,
                limits.cpus,
            ),
            job.network,
        )

        def ready() -> tuple[_Warm, Usage]:
            prepare_workspace(job.workspace, owner)
            warm = self._take(key) or self._create(key)
            warm.cgroups.reset_peak()
            return warm, warm.cgroups.usage()

        try:
            warm, before = await asyncio.to_thread(ready)
        except docker.errors.DockerException as error:
            raise ToolRefused(
                ToolError(
                    kind="unavailable",
                    message=f"the container engine could not start the command: {error}",
                    retryable=True,
                )
            ) from error

        def used() -> Usage:
            return warm.cgroups.usage().since(before)

        try:
            run = await self._exec(warm, job, uid, control, used if warm.cgroups.visible else None)
        except docker.errors.DockerException as error:
            await asyncio.to_thread(_remove, warm.container)
            raise ToolRefused(
                ToolError(
                    kind="unavailable",
                    message=f"the container engine could not run the command: {error}",
                    retryable=True,
                )
            ) from error
        except _LostCommand as lost:
            await asyncio.to_thread(_remove, warm.container)
            raise ToolRefused(
                ToolError(
                    kind="unknown_outcome",
                    message="the container engine stopped answering after the command was "
                    f"started, so it may have run in part or in full: {lost.cause}",
                    retryable=False,
                    suggestion="look at the workspace to see what the command did before "
                    "running it again",
                )
            ) from lost.cause
        usage = used()
        if await asyncio.to_thread(self._clean, warm, uid):
            warm.idle_since = time.monotonic()
            self._idle.setdefault(key, []).append(warm)
            self._sweep_later()
        else:
            await asyncio.to_thread(_remove, warm.container)
        limit = run.limit
        if run.ended == "exited":
            observed = Observed(run.exit_code, usage.oom_kills, usage.forks_refused, usage.cpu_s)
            limit = limit_that_stopped(observed, limits)
        return CommandResult(run, limit, resource_usage(run.wall_ms, usage))

    async def close(self) -> None:
        """Remove every warm container and close the engine's client."""
        await self._remove_warm()
        self._client.close()

    async def _remove_warm(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        idle = [warm for pool in self._idle.values() for warm in pool]
        self._idle.clear()
        for warm in idle:
            await asyncio.to_thread(_remove, warm.container)

    def _take(self, key: _Key) -> _Warm | None:
        pool = self._idle.get(key, [])
        while pool:
            warm = pool.pop()
            # A keeper the OOM killer chose has taken its container down with it.
            fresh = time.monotonic() - warm.created < _REUSE_FOR_S
            if fresh and all(alive(pid) for pid in warm.keepers):
                return warm
            _remove(warm.container)
        return None

    def _create(self, key: _Key) -> _Warm:
        memory_mb, max_processes, cpu_s, max_file_mb, cpus = key.limits
        cpu = math.ceil(cpu_s)
        size = max_file_mb * 1024 * 1024
        tmp = self._settings.tmp_size_mb * 1024 * 1024
        profile = self._profile
        container: Container = self._client.containers.run(
            self._image,
            _KEEPER,
            detach=True,
            auto_remove=True,
            init=True,
            user=_KEEPER_USER,
            labels={LABEL: "warm"},
            network_mode=profile.granted_network if key.network else "none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ipc_mode="private",
            mem_limit=f"{memory_mb}m",
            memswap_limit=f"{memory_mb}m",
            pids_limit=max_processes + _KEEPER_PROCESSES,
            nano_cpus=int(cpus * 1e9) if cpus else None,
            ulimits=[
                # The soft limit sends SIGXCPU, which a program may catch; the hard one kills.
                Ulimit(name="cpu", soft=cpu, hard=cpu + 1),
                Ulimit(name="fsize", soft=size, hard=size),
                Ulimit(name="core", soft=0, hard=0),
            ],
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={tmp},mode=1777"},
            mounts=[Mount(WORKSPACE_MOUNT, str(key.workspace), type="bind")],
            working_dir=WORKSPACE_MOUNT,
        )
        container.reload()
        pid = int(container.attrs["State"]["Pid"])
        cgroups = CallCgroups.of_process(pid)
        root = Path(f"/proc/{pid}/root")
        visible = cgroups.visible and os.access(root / "tmp", os.W_OK)
        keepers: frozenset[int] = frozenset()
        if visible:
            # The engine's init starts the keeper a moment after the container starts.
            deadline = time.monotonic() + _DRAIN_S
            while len(keepers) < _KEEPER_PROCESSES and time.monotonic() < deadline:
                keepers = frozenset(cgroups.members())
                time.sleep(0.001)
            if len(keepers) != _KEEPER_PROCESSES:
                visible = False
        return _Warm(container, cgroups, root if visible else None, keepers)

    async def _exec(
        self,
        warm: _Warm,
        job: CommandJob,
        uid: int,
        control: CommandControl,
        used: Callable[[], Usage] | None,
    ) -> CommandRun:
        """Run the command in the container until it ends, times out, is cancelled or
        crosses a limit; whatever it started is killed before this returns."""
        api = self._client.api
        limits = job.limits
        output = Output(limits.max_output_bytes)
        started = time.perf_counter()
        environment = {**job.env, **ENVIRONMENT, MARKER_VARIABLE: control.marker}
        exec_id: str = await asyncio.to_thread(
            lambda: api.exec_create(
                warm.container.id,
                [SHELL, "-c", job.command],
                user=f"{uid}:{uid}",
                workdir=WORKSPACE_MOUNT,
                environment=environment,
            )["Id"]
        )

        def stream() -> None:
            connection = api.exec_start(exec_id, socket=True)
            try:
                frames: Iterator[tuple[int, bytes]] = frames_iter(connection, tty=False)  # type: ignore[no-untyped-call]
                for fd, data in frames:
                    output.add(fd, data)
            finally:
                # The SDK leaves the HTTP response of a raw stream for its caller to close.
                getattr(connection, "_response").close()  # noqa: B009 (untyped in the SDK)
                connection.close()

        streaming = asyncio.ensure_future(asyncio.to_thread(stream))
        cancelled = asyncio.ensure_future(control.cancel.wait())
        watches = [watch_disk_of(job, control)] if job.disk_allowed is not None else []
        if used is not None:
            counters = watch_limits(
                used, limits, job.command, control.approached, not_the_commands=_KEEPER_PROCESSES
            )
            watches.append(counters)
        crossed: asyncio.Future[LimitName] = (
            asyncio.ensure_future(first_limit(*watches))
            if watches
            else asyncio.get_running_loop().create_future()
        )
        try:
            ended = await how_it_ends(streaming, cancelled, crossed, limits.timeout_s)
            if ended != "exited":
                await asyncio.to_thread(self._stop_command, warm, uid)
                await asyncio.wait((streaming,), timeout=_DRAIN_S)
            exit_code = None
            if ended == "exited":
                inspected: dict[str, Any] = await asyncio.to_thread(api.exec_inspect, exec_id)
                exit_code = inspected.get("ExitCode")
        except (docker.errors.DockerException, requests.RequestException) as error:
            # The command was started: an engine failure now (an error, or no answer at all)
            # cannot say it did not run.
            raise _LostCommand(error) from error
        finally:
            cancelled.cancel()
            if not crossed.done():
                crossed.cancel()
        if streaming.done() and not streaming.cancelled() and streaming.exception():
            logger.warning("output of call %s was cut short: %s", job, streaming.exception())
        return CommandRun(
            ended=ended,
            limit=crossed.result() if ended == "limit" else None,
            exit_code=exit_code,
            output=output,
            wall_ms=(time.perf_counter() - started) * 1000,
        )

    def _stop_command(self, warm: _Warm, uid: int) -> None:
        """Kill every process of the command now. Blocking."""
        if warm.root is not None:
            warm.cgroups.kill_all(sparing=warm.keepers)
        else:
            with contextlib.suppress(docker.errors.DockerException):
                warm.container.exec_run([SHELL, "-c", "kill -9 -1"], user=f"{uid}:{uid}")

    def _clean(self, warm: _Warm, uid: int) -> bool:
        """Leave the container as the next call must find it (no process of this one, an
        empty /tmp); whether that worked and the container can be used again. Blocking."""
        try:
            if warm.root is None:
                result = warm.container.exec_run([SHELL, "-c", _CLEAN], user=f"{uid}:{uid}")
                return result.exit_code == 0
            if not warm.cgroups.kill_all(sparing=warm.keepers):
                return False
            tmp = warm.root / "tmp"
            for entry in os.scandir(tmp):
                # Through the container's root: links inside point into the container,
                # and are removed, never followed.
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            return True
        except (OSError, docker.errors.DockerException) as error:
            logger.warning("container %s not reused: %s", warm.container.short_id, error)
            return False

    def _sweep_later(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        # Runs only while containers wait, so an idle backend does nothing.
        while self._idle:
            await asyncio.sleep(_IDLE_S / 4)
            now = time.monotonic()
            for key, pool in list(self._idle.items()):
                stale = [warm for warm in pool if now - warm.idle_since > _IDLE_S]
                for warm in stale:
                    pool.remove(warm)
                    await asyncio.to_thread(_remove, warm.container)
                if not pool:
                    del self._idle[key]


class _LostCommand(Exception):
    """The engine failed after the command was started, so whether it ran is unknown."""

    def __init__(self, cause: docker.errors.DockerException | requests.RequestException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _remove(container: Container) -> None:
    # Gone already, or the engine is: nothing left to remove from here.
    with contextlib.suppress(
        docker.errors.NotFound, docker.errors.APIError, requests.RequestException
    ):
        container.remove(force=True)
