"""Where `run_command` runs: under bubblewrap with cgroups and rlimits (the default), or as
a plain child process for development (`unsandboxed`, chosen explicitly)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import os
import resource
import stat
import sys
import tempfile
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Protocol

from helmline.confinement import (
    NAMESPACES_ADVICE,
    Bubblewrap,
    BubblewrapUnavailable,
    Destination,
    Egress,
    Rlimits,
    find_bubblewrap,
    limited_argv,
    namespaces_refused,
    open_egress,
)
from helmline.contracts import MAX_EGRESS_REFUSED, ResourceUsage, ToolError
from helmline.sandbox._cgroups import (
    CALL_PREFIX,
    CallCgroups,
    CgroupLayout,
    Usage,
    detect_layout,
    remove_stale,
)
from helmline.sandbox._commands import (
    MARKER_VARIABLE,
    CommandControl,
    CommandRun,
    Launch,
    Reaper,
    run_process,
)
from helmline.sandbox._confinement import (
    SEARCH_PATH,
    SHELL,
    Confinement,
    Mask,
    bwrap_argv,
    session_uid,
)
from helmline.sandbox._errors import SandboxUnavailable, ToolRefused
from helmline.sandbox._limits import LimitName, Limits, Observed, limit_that_stopped
from helmline.sandbox._paths import NO_RULES, PathRules
from helmline.sandbox._settings import SandboxSettings
from helmline.sandbox._watch import (
    WATCH_INTERVAL_S,
    first_limit,
    resource_usage,
    watch_disk,
    watch_limits,
)

logger = logging.getLogger(__name__)

UNSANDBOXED_WARNING = (
    "UNSANDBOXED (HELMLINE_SANDBOX_BACKEND=unsandboxed): commands run WITHOUT isolation, "
    "with the service's privileges, network and files; never use this outside development"
)

_SANDBOX_PROCESSES = 2
"""bubblewrap and its pid-namespace init, counted by the pids cgroup besides the command."""
_FORWARDER_TASKS = 16
"""What the egress forwarder may add to the pids cgroup's count (its threads: one a route,
one watching, two a connection relayed)."""
_REMOVAL_ATTEMPTS = 100
_STALE_AFTER_S = 300.0
"""Age past which an empty call cgroup found at start is taken to be left by a killed
sandbox: far longer than the moment between a cgroup's creation and its first process."""


@dataclass(frozen=True, slots=True)
class CommandJob:
    """One `run_command` call."""

    command: str
    workspace: Path
    tenant: str
    session_id: str
    limits: Limits
    network: bool
    egress: tuple[Destination, ...] = ()
    """With `network`: the only destinations the command may connect to (process backend);
    none: the host's network."""
    rules: PathRules = NO_RULES
    """Parts of the workspace the command may only read, or not see (process backend)."""
    disk_allowed: int | None = None
    """Bytes the workspace may take while the command runs; None: no quota."""
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    """The call's own environment variables (secrets resolved), under those every command
    gets."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How the command ended, the limit that stopped it, and what it used."""

    run: CommandRun
    limit: LimitName | None
    usage: ResourceUsage
    egress_refused: tuple[str, ...] = ()
    """Connections the command was refused (`host:port`, in order, the first
    `MAX_EGRESS_REFUSED`), when it ran with egress to named destinations."""


class CommandBackend(Protocol):
    """Runs commands in workspaces."""

    def workspace_owner(self, tenant: str, session_id: str) -> int | None:
        """The uid that must own the session's workspace, None to keep the service's."""
        ...

    async def run(self, job: CommandJob, control: CommandControl) -> CommandResult:
        """Run one command to its end, killing everything it started."""
        ...

    def describe(self) -> str:
        """How commands are confined, for operators (`helmline status`, the start log)."""
        ...

    async def close(self) -> None:
        """Release what the backend holds between calls."""
        ...


def prepare_workspace(workspace: Path, owner: int | None) -> None:
    """Create the workspace if needed, owned by `owner` and private to it. Blocking."""
    workspace.mkdir(parents=True, exist_ok=True)
    if owner is not None and workspace.stat().st_uid != owner:
        # A workspace made before it had an owner (or under another uid range): all it
        # holds becomes the session's, or its commands could not change those files.
        for folder, folders, files in os.walk(workspace):
            for name in [*folders, *files]:
                os.lchown(os.path.join(folder, name), owner, owner)
        # Group root may only pass through: bubblewrap, root without capabilities by
        # then, must enter it to start the command there.
        os.chown(workspace, owner, 0)
        workspace.chmod(0o710)


def open_masks(workspace: Path, rules: PathRules) -> tuple[Mask, ...]:
    """The masks of the rules' paths the workspace holds now, parents first; the caller
    closes their descriptors. Blocking.

    A path reached through a symbolic link is not masked: a command following the link
    reaches its target, which the rules do not name. A path inside a blocked one is hidden
    with it.
    """
    named = [(path, True) for path in rules.blocked] + [(path, False) for path in rules.read_only]
    masks: list[Mask] = []
    try:
        for path, blocked in sorted(named, key=lambda rule: len(rule[0].parts)):
            if any(rule in path.parents for rule in rules.blocked):
                continue
            fd = _open_beneath(workspace, path)
            if fd is None:
                continue
            if not blocked:
                masks.append(Mask(path, "read_only", fd))
                continue
            folder = stat.S_ISDIR(os.fstat(fd).st_mode)
            os.close(fd)
            if folder:
                masks.append(Mask(path, "blocked_folder"))
            else:
                masks.append(
                    Mask(path, "blocked_file", os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
                )
    except BaseException:
        for mask in masks:
            if mask.fd is not None:
                os.close(mask.fd)
        raise
    return tuple(masks)


def _open_beneath(workspace: Path, path: PurePosixPath) -> int | None:
    """An `O_PATH` descriptor of `path` in the workspace, following no link on the way;
    None if it is not there or is a link."""
    folder = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.parts[:-1]:
            inner = os.open(
                part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder
            )
            os.close(folder)
            folder = inner
        found = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    finally:
        os.close(folder)
    if stat.S_ISLNK(os.fstat(found).st_mode):
        os.close(found)
        return None
    return found


def session_owner(settings: SandboxSettings, tenant: str, session_id: str) -> int | None:
    """The uid a session's commands run as and that owns its workspace: its own, when the
    service runs as root; None (the service's own) otherwise."""
    if os.geteuid() != 0:
        return None
    return session_uid(tenant, session_id, settings.sandbox_uid_base, settings.sandbox_uid_count)


class ProcessBackend:
    """bubblewrap namespaces, the call's own cgroups and rlimits."""

    def __init__(self, settings: SandboxSettings, bwrap: Bubblewrap, layout: CgroupLayout) -> None:
        self._settings = settings
        self.bwrap = bwrap
        """The bubblewrap that confines every call."""
        self._layout = layout
        self._removals: set[asyncio.Task[None]] = set()

    def describe(self) -> str:
        return f"{self.bwrap.describe()}, cgroups {self._layout.version}"

    @classmethod
    async def start(cls, settings: SandboxSettings) -> ProcessBackend:
        """The backend, once bubblewrap is found and has run `true` confined.

        Raises `SandboxUnavailable`, saying what to install or configure, otherwise.
        """
        try:
            bwrap = await asyncio.to_thread(find_bubblewrap, settings.bwrap)
        except BubblewrapUnavailable as error:
            raise SandboxUnavailable(str(error)) from error
        _wait_for_children_with_pidfds()
        layout = await asyncio.to_thread(detect_layout)
        stale = await asyncio.to_thread(remove_stale, layout, _STALE_AFTER_S)
        if stale:
            logger.info("removed %d call cgroup(s) left by an earlier sandbox", stale)
        logger.info(
            "sandbox: %s, cgroups %s (controllers: %s)",
            bwrap.describe(),
            layout.version,
            ", ".join(sorted(layout.places)) or "none; rlimits only",
        )
        capped = settings.default_cpus is not None or any(
            profile.cpus for profile in settings.sandbox_profiles.values()
        )
        if capped and "cpu_quota" not in layout.places:
            logger.warning(
                "sandbox: CPU caps (cpus) are configured, but this host offers no cgroup cpu "
                "controller the sandbox may use: commands run without them"
            )
        backend = cls(settings, bwrap, layout)
        await backend._probe()
        return backend

    async def _probe(self) -> None:
        with tempfile.TemporaryDirectory(prefix="helmline-probe-") as folder:
            workspace = Path(folder) / "workspace"
            result = await self.run(
                CommandJob(
                    command="true",
                    workspace=workspace,
                    tenant="probe",
                    session_id="probe",
                    limits=Limits(10.0, 10.0, 64, 16, 1, 4096),
                    network=False,
                ),
                CommandControl(f"probe-{os.getpid()}", asyncio.Event(), Reaper()),
            )
        if result.run.exit_code != 0:
            said = bytes(result.run.output.kept[2]).decode(errors="replace").strip()
            advice = f". {NAMESPACES_ADVICE}" if namespaces_refused(said) else ""
            raise SandboxUnavailable(
                f"{self.bwrap.describe()} cannot create a sandbox here "
                f"(exit {result.run.exit_code}): {said}{advice}"
            )

    async def close(self) -> None:
        pass  # Nothing outlives a call.

    def workspace_owner(self, tenant: str, session_id: str) -> int | None:
        return session_owner(self._settings, tenant, session_id)

    async def run(self, job: CommandJob, control: CommandControl) -> CommandResult:
        async with contextlib.AsyncExitStack() as stack:
            refused: list[str] = []
            egress = None
            if job.network and job.egress:
                egress = await open_egress(
                    job.egress, lambda asked, _reason: refused.append(asked), stack
                )
            result = await self._run(job, control, egress)
        if refused:
            result = replace(result, egress_refused=tuple(refused[:MAX_EGRESS_REFUSED]))
        return result

    async def _run(
        self, job: CommandJob, control: CommandControl, egress: Egress | None
    ) -> CommandResult:
        limits = job.limits
        uid = self.workspace_owner(job.tenant, job.session_id)
        cgroups = CallCgroups(self._layout, f"{CALL_PREFIX}{control.marker}")
        helpers = _SANDBOX_PROCESSES + (_FORWARDER_TASKS if egress is not None else 0)

        def prepare() -> tuple[Mask, ...]:
            # One trip to a worker thread for all: each trip costs on a loaded host.
            prepare_workspace(job.workspace, uid)
            cgroups.create(limits.memory_mb, limits.max_processes + helpers, limits.cpus)
            return open_masks(job.workspace, job.rules)

        def finish() -> tuple[Usage, bool]:
            cgroups.kill_all()
            return cgroups.usage(), cgroups.remove()

        masks = await asyncio.to_thread(prepare)
        held = {mask.fd for mask in masks if mask.fd is not None}
        confinement = Confinement(
            job.workspace, job.network, uid, self._settings.tmp_size_mb, masks, egress
        )
        rlimits = _rlimits(
            limits,
            per_uid=uid is not None,
            # Where the pids cgroup counts (and reports) processes, the per-uid count is
            # only a loose backstop, so the cgroup is the limit that trips.
            nproc_slack=2 if "pids" in self._layout.places else 1,
        )

        async def watch() -> LimitName:
            watches = [watch_disk_of(job, control)] if job.disk_allowed is not None else []
            if self._layout.places:
                counters = watch_limits(
                    cgroups.usage,
                    limits,
                    job.command,
                    control.approached,
                    not_the_commands=helpers,
                )
                watches.append(counters)
            return await first_limit(*watches)

        # bubblewrap says when its sandbox exists and waits: the sandbox joins the call's
        # cgroups and rlimits from here, before the command starts, with no program
        # between (each one exec'd costs milliseconds).
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        opened = {info_read, info_write, block_read, block_write, *held}

        def close(fd: int) -> None:
            if fd in opened:
                opened.discard(fd)
                os.close(fd)

        async def release(pid: int) -> None:
            close(info_write)  # bubblewrap holds its own copies of these two now
            close(block_read)
            try:
                await asyncio.to_thread(_join_sandbox, info_read, pid, cgroups, rlimits)
            except OSError as error:
                raise ToolRefused(
                    ToolError(
                        kind="unavailable",
                        message=f"the command's sandbox could not be limited: {error}",
                        retryable=True,
                    )
                ) from error
            with contextlib.suppress(BrokenPipeError):  # It ended already: it says why.
                os.write(block_write, b"go")

        launch = Launch(
            bwrap_argv(
                self.bwrap.path,
                confinement,
                job.command,
                MARKER_VARIABLE,
                held=(info_write, block_read),
            ),
            cwd=job.workspace,
            env=dict(job.env),
            contained=True,
            pass_fds=(info_write, block_read, *held),
            release=release,
        )
        try:
            run = await run_process(
                launch,
                timeout_s=limits.timeout_s,
                cap=limits.max_output_bytes,
                control=control,
                watch=watch if self._layout.places or job.disk_allowed is not None else None,
            )
        finally:
            for fd in list(opened):
                close(fd)
            usage, removed = await asyncio.to_thread(finish)
            if not removed:
                removal = asyncio.create_task(_remove_soon(cgroups))
                self._removals.add(removal)
                removal.add_done_callback(self._removals.discard)
        limit = run.limit
        if run.ended == "exited":
            observed = Observed(run.exit_code, usage.oom_kills, usage.forks_refused, usage.cpu_s)
            limit = limit_that_stopped(observed, limits)
        return CommandResult(run, limit, resource_usage(run.wall_ms, usage))


def watch_disk_of(job: CommandJob, control: CommandControl) -> Awaitable[LimitName]:
    """The watch on what the job's workspace takes, for a job with a quota."""
    assert job.disk_allowed is not None
    return watch_disk(job.workspace, job.disk_allowed, job.limits, job.command, control.approached)


def _wait_for_children_with_pidfds() -> None:
    # Python 3.11 waits for each child process on a new thread of its own, which costs
    # milliseconds per command on a busy host; a pidfd watched by the event loop does not
    # (Python 3.12 does this by itself).
    if sys.version_info < (3, 12) and hasattr(os, "pidfd_open"):
        watcher = asyncio.PidfdChildWatcher()
        # Attached to this loop; a loop set later (in the main thread) attaches it itself.
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)


def _join_sandbox(info: int, pid: int, cgroups: CallCgroups, rlimits: Rlimits) -> None:
    """Put bubblewrap (`pid`) and its sandbox, whose pid it writes to `info`, into the
    call's cgroups and under its rlimits. Blocking until the sandbox exists.

    bubblewrap is moved while it sets up, so that the sandbox it then forks is born inside
    (moving a process between v1 cgroups waits for an RCU grace period); when it forked
    first, the sandbox is moved too.
    """
    try:
        _limit(pid, cgroups, rlimits)
        written = bytearray()
        while chunk := os.read(info, 4096):
            written += chunk
        if not written:
            return  # bubblewrap failed before making its sandbox: its exit status says why.
        sandbox = int(json.loads(written)["child-pid"])
        if cgroups.holds(sandbox):
            for _, kind, soft, hard in rlimits:
                resource.prlimit(sandbox, kind, (soft, hard))
        else:
            _limit(sandbox, cgroups, rlimits)
    except ProcessLookupError:
        pass  # Ended already: its exit status says why.
    except OSError as error:
        if error.errno != errno.ESRCH:
            raise


def _limit(pid: int, cgroups: CallCgroups, rlimits: Rlimits) -> None:
    cgroups.join(pid)
    for _, kind, soft, hard in rlimits:
        resource.prlimit(pid, kind, (soft, hard))


async def _remove_soon(cgroups: CallCgroups) -> None:
    # Off the call's path: its processes are dead, the kernel only has to finish with them.
    for _ in range(_REMOVAL_ATTEMPTS):
        await asyncio.sleep(WATCH_INTERVAL_S)
        if cgroups.remove():
            return
    logger.warning("cgroups %s could not be removed", cgroups.name)


class UnsandboxedBackend:
    """A plain child process with rlimits: no isolation at all. Development only."""

    def workspace_owner(self, tenant: str, session_id: str) -> int | None:
        return None

    def describe(self) -> str:
        return UNSANDBOXED_WARNING

    async def close(self) -> None:
        pass  # Nothing outlives a call.

    async def run(self, job: CommandJob, control: CommandControl) -> CommandResult:
        await asyncio.to_thread(prepare_workspace, job.workspace, None)
        rlimits = _rlimits(job.limits, per_uid=False, nproc_slack=1)
        launch = Launch(
            limited_argv(rlimits, [SHELL, "-c", job.command]),
            cwd=job.workspace,
            env={**job.env, "PATH": SEARCH_PATH},
        )
        run = await run_process(
            launch, timeout_s=job.limits.timeout_s, cap=job.limits.max_output_bytes, control=control
        )
        limit = (
            limit_that_stopped(Observed(run.exit_code), job.limits)
            if run.ended == "exited"
            else None
        )
        return CommandResult(run, limit, ResourceUsage(wall_ms=run.wall_ms))


async def start_backend(settings: SandboxSettings) -> CommandBackend:
    """The backend the settings choose, checked to work on this host."""
    match settings.sandbox_backend:
        case "process":
            return await ProcessBackend.start(settings)
        case "unsandboxed":
            logger.warning("sandbox: %s", UNSANDBOXED_WARNING)
            return UnsandboxedBackend()


def _rlimits(limits: Limits, *, per_uid: bool, nproc_slack: int) -> Rlimits:
    cpu = math.ceil(limits.cpu_s)
    size = limits.max_file_mb * 1024 * 1024
    chosen = [
        # The soft limit sends SIGXCPU, which a program may catch; the hard one kills.
        ("cpu", resource.RLIMIT_CPU, cpu, cpu + 1),
        ("fsize", resource.RLIMIT_FSIZE, size, size),
        ("core", resource.RLIMIT_CORE, 0, 0),
    ]
    if per_uid:
        # Counted per uid host-wide, so only meaningful for a uid of the session's own.
        nproc = limits.max_processes * nproc_slack
        chosen.append(("nproc", resource.RLIMIT_NPROC, nproc, nproc))
    return tuple(_within_hard(name, kind, soft, hard) for name, kind, soft, hard in chosen)


def _within_hard(name: str, kind: int, soft: int, hard: int) -> tuple[str, int, int, int]:
    # Without CAP_SYS_RESOURCE no limit can rise above the host's hard limit.
    _, host_hard = resource.getrlimit(kind)
    if host_hard != resource.RLIM_INFINITY:
        hard = min(hard, host_hard)
        soft = min(soft, hard)
    return name, kind, soft, hard
