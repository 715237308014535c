"""Running a call's process: its own process group, a wall clock, a cancel, a watchdog.

A call leaves nothing running. When the launched process ends (or is killed for a timeout,
a cancel or a limit) its process group is killed, and so is every process that carries the
call's marker in its environment, which catches children that left the group with
`setsid`. Under bubblewrap the marker is on bubblewrap itself, whose death takes the whole
sandbox (its pid namespace) with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from helmline.contracts import LimitHit, ResourceUsage, ToolError
from helmline.sandbox._errors import ToolRefused
from helmline.sandbox._limits import LimitName

MARKER_VARIABLE = "HELMLINE_SANDBOX_CALL"

_OUTPUT_FDS = (1, 2)
_SETTLE_S = 0.05
"""How long output may take to close once the shell's group is dead, before the marked
processes that may still hold it are hunted down."""
_DRAIN_S = 1.0
"""How long to wait for output after every marked process was killed."""
_SWEEPS = 5


Ended = Literal["exited", "timeout", "cancelled", "limit"]
Watch = Callable[[], Awaitable[LimitName]]
"""Returns once a limit is crossed (and never otherwise): the call is then killed."""
Approached = Callable[[LimitHit, float, ResourceUsage], None]
"""Told once per limit that a running call has used 90 % of it: which limit (its value, the
command), how much of it was used, and the call's usage so far."""


def _unheard(hit: LimitHit, used: float, usage: ResourceUsage) -> None:
    del hit, used, usage


@dataclass(frozen=True, slots=True)
class Launch:
    """The process that runs a call."""

    argv: Sequence[str]
    """What to execute."""
    cwd: Path
    """Where."""
    env: Mapping[str, str]
    """Its whole environment (the call's marker is added)."""
    contained: bool = False
    """Whether everything the process starts dies with it (a pid namespace), so nothing
    needs hunting once it has exited."""
    pass_fds: tuple[int, ...] = ()
    """File descriptors the process inherits."""
    release: Callable[[int], Awaitable[None]] | None = None
    """Called with the process's pid once it has started; for a process that waits to be
    released (put into its cgroups, say) before it runs the command."""


@dataclass(frozen=True, slots=True)
class CommandRun:
    """How a command ended and what it wrote."""

    ended: Ended
    """Whether it exited by itself or was killed for a timeout, a cancel or a limit."""
    limit: LimitName | None
    """The limit the watchdog saw crossed, when that killed it."""
    exit_code: int | None
    """The shell's exit status (128 + N when signal N ended it); None when it was killed."""
    output: Output
    """What it wrote: the first bytes of each stream, and how many in all."""
    wall_ms: float
    """Elapsed time from start to end."""


@dataclass(frozen=True, slots=True)
class CommandControl:
    """How one call's processes are found and stopped."""

    marker: str
    """Carried in the environment of every process of the call; derived from the request,
    so a sandbox restarted after a crash finds the processes of the call it interrupted."""
    cancel: asyncio.Event
    """Set when the call's session is cancelled."""
    reaper: Reaper
    """Kills what the call leaves running once it has ended."""
    approached: Approached = _unheard
    """Where warnings about limits the call comes near go."""


class Output:
    """Keeps the first `cap` bytes of stdout (1) and stderr (2) and counts the rest away."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = {fd: bytearray() for fd in _OUTPUT_FDS}
        self.totals = dict.fromkeys(_OUTPUT_FDS, 0)

    def add(self, fd: int, data: bytes) -> None:
        """Take what a stream wrote next."""
        kept = self.kept[fd]
        room = self.cap - len(kept)
        if room > 0:
            kept += data[:room]
        self.totals[fd] += len(data)


class _Capture(asyncio.SubprocessProtocol):
    """Collects a process's output; reading never stops, so a chatty command is never
    blocked on a full pipe."""

    def __init__(self, cap: int) -> None:
        loop = asyncio.get_running_loop()
        self.output = Output(cap)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.output.add(fd, data)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        # Called once the process has exited and every pipe is closed.
        if not self.closed.done():
            self.closed.set_result(None)


async def run_process(
    launch: Launch,
    *,
    timeout_s: float,
    cap: int,
    control: CommandControl,
    watch: Watch | None = None,
) -> CommandRun:
    """Run `launch` until it ends, `timeout_s` passes, the call is cancelled or `watch`
    returns.

    Whatever it started is killed before this returns, except processes that closed their
    output and left the process group: the reaper kills those shortly after.
    """
    marker, reaper = control.marker, control.reaper
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    try:
        transport, capture = await loop.subprocess_exec(
            lambda: _Capture(cap),
            *launch.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=launch.cwd,
            env={**launch.env, MARKER_VARIABLE: marker},
            start_new_session=True,
            pass_fds=launch.pass_fds,
        )
    except OSError as error:  # No process left to run it (EAGAIN), or the workspace vanished.
        raise ToolRefused(
            ToolError(
                kind="unavailable",
                message=f"the command could not be started: {error.strerror or error}",
                retryable=True,
            )
        ) from error
    group = transport.get_pid()
    cancelled = asyncio.ensure_future(control.cancel.wait())
    crossed: asyncio.Future[LimitName] = loop.create_future()
    try:
        if launch.release is not None:
            await launch.release(group)
        if watch is not None:
            crossed = asyncio.ensure_future(watch())
        ended = await how_it_ends(capture.exited, cancelled, crossed, timeout_s)
        _kill_group(group)
        if ended != "exited":
            await asyncio.to_thread(kill_marked, marker)
            await _settled(capture.exited, _DRAIN_S)
        await _wait_for_output(capture, marker)
        return_code = transport.get_returncode()
    finally:
        cancelled.cancel()
        if not crossed.done():
            crossed.cancel()
        if transport.get_returncode() is None or not capture.closed.done():
            # Interrupted (shutdown) or output held open by a process nothing could find.
            _kill_group(group)
            kill_marked(marker)
        transport.close()
    if ended == "exited" and not launch.contained:
        # Daemons that closed their output and left the group may linger; no call leaves
        # a process behind, but hunting them costs a scan of every process, so it is
        # batched off the calls' critical path.
        reaper.hunt(marker)
    return CommandRun(
        ended=ended,
        limit=crossed.result() if ended == "limit" else None,
        exit_code=_exit_code(return_code) if ended == "exited" else None,
        output=capture.output,
        wall_ms=(time.perf_counter() - started) * 1000,
    )


async def how_it_ends(
    exited: asyncio.Future[Any],
    cancelled: asyncio.Future[Any],
    crossed: asyncio.Future[Any],
    timeout_s: float,
) -> Ended:
    """Wait until the command exits, is cancelled, crosses a limit or runs out of time;
    which came first."""
    await asyncio.wait(
        (exited, cancelled, crossed), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
    )
    if exited.done():
        return "exited"
    if cancelled.done():
        return "cancelled"
    if crossed.done():
        return "limit"
    return "timeout"


async def _wait_for_output(capture: _Capture, marker: str) -> None:
    """Wait until the output pipes close, killing marked processes that keep them open."""
    if await _settled(capture.closed, _SETTLE_S):
        return
    await asyncio.to_thread(kill_marked, marker)
    await _settled(capture.closed, _DRAIN_S)


async def _settled(future: asyncio.Future[None], timeout_s: float) -> bool:
    done, _ = await asyncio.wait((future,), timeout=timeout_s)
    return bool(done)


def _exit_code(return_code: int | None) -> int | None:
    if return_code is None:
        return None
    return 128 - return_code if return_code < 0 else return_code


def _kill_group(group: int) -> None:
    # The group outlives its leader while any member lives, and Linux never hands out a
    # process id still in use as a group id, so this cannot hit an unrelated process.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def kill_marked(marker: str) -> None:
    """SIGKILL every process whose environment carries the call's marker."""
    # Repeated because a process may fork between being found and being killed.
    for _ in range(_SWEEPS):
        if not _sweep({marker}):
            return


def _sweep(markers: set[str]) -> set[str]:
    """One pass over every process: SIGKILL those carrying a marker; the markers found."""
    entries = {f"{MARKER_VARIABLE}={marker}".encode(): marker for marker in markers}
    found: set[str] = set()
    own = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == own:
            continue
        for entry in _environment(name):
            marker = entries.get(entry)
            if marker is not None:
                found.add(marker)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signal.SIGKILL)
                break
    return found


def _environment(pid: str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read().split(b"\0")
    except OSError:
        return []


class Reaper:
    """Kills what finished calls left running, in batches, a moment after they end."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self._interval_s = interval_s
        self._markers: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def hunt(self, marker: str) -> None:
        """Kill the processes carrying `marker` soon."""
        self._markers.add(marker)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        # Runs only while there is something to hunt, so an idle sandbox scans nothing.
        while self._markers:
            await asyncio.sleep(self._interval_s)
            markers = set(self._markers)
            found = await asyncio.to_thread(_sweep, markers)
            # A marker found is hunted once more, for children forked meanwhile.
            self._markers -= markers - found
