"""Control groups for each call: which hierarchy the host has, limits, counters, cleanup.

Hosts differ: cgroup v1 (a hierarchy per controller), v2 (one unified hierarchy) or hybrid
(v1 controllers next to an empty v2 mount). `parse_layout` decides, per controller, where
its cgroups live; a call's cgroups are children of the service's own cgroups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

Controller = Literal["memory", "pids", "cpu", "cpu_quota"]
"""`cpu` counts the CPU time a call used; `cpu_quota` caps the share of CPUs it may use at
once. One controller on v2; on v1 `cpuacct` and `cpu`, which a host may mount apart."""
CONTROLLERS: tuple[Controller, ...] = ("memory", "pids", "cpu", "cpu_quota")
_KILL_WAIT_S = 2.0
_V1_NAMES: dict[Controller, str] = {
    "memory": "memory",
    "pids": "pids",
    "cpu": "cpuacct",
    "cpu_quota": "cpu",
}
_V2_NAMES: dict[Controller, str] = {
    "memory": "memory",
    "pids": "pids",
    "cpu": "cpu",
    "cpu_quota": "cpu",
}
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class Place:
    """Where one controller's cgroups are made."""

    parent: Path
    """The service's own cgroup in that hierarchy."""
    v2: bool
    """Whether it is the unified (v2) hierarchy."""


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """The host's cgroup hierarchies, as far as calls use them."""

    version: Literal["v1", "v2", "hybrid", "none"]
    """Which kind of host this is."""
    places: dict[Controller, Place]
    """The usable controllers and where their cgroups go."""


def parse_layout(own_cgroups: str, mounts: str, v2_controllers: str | None) -> CgroupLayout:
    """The layout from `/proc/self/cgroup`, `/proc/self/mounts` and the controllers of the
    service's v2 cgroup (`cgroup.controllers`, None if there is no v2 mount)."""
    own_v1: dict[str, str] = {}
    own_v2: str | None = None
    for line in own_cgroups.splitlines():
        number, names, path = line.split(":", 2)
        if number == "0" and not names:
            own_v2 = path
        for name in names.split(","):
            if name:
                own_v1[name] = path
    v1_mounts: dict[str, Path] = {}
    v2_mount: Path | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            v2_mount = Path(fields[1])
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                v1_mounts.setdefault(option, Path(fields[1]))
    places: dict[Controller, Place] = {}
    available_v2 = set((v2_controllers or "").split())
    for controller in CONTROLLERS:
        name = _V1_NAMES[controller]
        if name in v1_mounts and name in own_v1:
            places[controller] = Place(_under(v1_mounts[name], own_v1[name]), v2=False)
        elif v2_mount is not None and own_v2 is not None and _V2_NAMES[controller] in available_v2:
            places[controller] = Place(_under(v2_mount, own_v2), v2=True)
    has_v1 = bool(v1_mounts.keys() & set(_V1_NAMES.values()))
    version: Literal["v1", "v2", "hybrid", "none"]
    if has_v1 and v2_mount is not None:
        version = "hybrid"
    elif has_v1:
        version = "v1"
    elif v2_mount is not None:
        version = "v2"
    else:
        version = "none"
    return CgroupLayout(version, places)


def _under(mount: Path, path: str) -> Path:
    return mount / path.lstrip("/")


def detect_layout() -> CgroupLayout:
    """This host's layout, keeping only the controllers the service may create cgroups in."""
    own = Path("/proc/self/cgroup").read_text()
    mounts = Path("/proc/self/mounts").read_text()
    v2_controllers: str | None = None
    for line in own.splitlines():
        if line.startswith("0::"):
            for mount_line in mounts.splitlines():
                fields = mount_line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    own_dir = _under(Path(fields[1]), line[3:])
                    with contextlib.suppress(OSError):
                        v2_controllers = (own_dir / "cgroup.controllers").read_text()
                        _delegate(own_dir, v2_controllers)
    layout = parse_layout(own, mounts, v2_controllers)
    usable = {
        controller: place
        for controller, place in layout.places.items()
        if _can_create_under(place.parent)
    }
    return CgroupLayout(layout.version, usable)


def _delegate(own_dir: Path, controllers: str) -> None:
    # v2 lets children use a controller only once their parent enables it; refused while the
    # parent itself holds processes, in which case v2 limits are not available.
    wanted = [f"+{name}" for name in ("memory", "pids", "cpu") if name in controllers.split()]
    for entry in wanted:
        try:
            (own_dir / "cgroup.subtree_control").write_text(entry)
        except OSError as error:
            logger.warning("cannot enable %s for child cgroups: %s", entry, error)


def _can_create_under(parent: Path) -> bool:
    probe = parent / f"helmline-probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as error:
        logger.warning("cannot create cgroups under %s: %s", parent, error)
        return False
    return True


CALL_PREFIX = "helmline-"


def remove_stale(layout: CgroupLayout, older_than_s: float) -> int:
    """Remove call cgroups left behind by a sandbox that was killed; how many. Blocking.

    Only empty ones (the kernel refuses the others) older than `older_than_s`, so that a
    cgroup another sandbox process just made for a call is never taken from under it.
    """
    removed = 0
    now = time.time()
    for place in layout.places.values():
        with contextlib.suppress(FileNotFoundError):
            for child in place.parent.iterdir():
                if not child.name.startswith(CALL_PREFIX) or not child.is_dir():
                    continue
                try:
                    if now - child.stat().st_mtime > older_than_s:
                        child.rmdir()
                        removed += 1
                except OSError:
                    pass  # Still has processes, or gone meanwhile.
    return removed


@dataclass(frozen=True, slots=True)
class Usage:
    """What a call's cgroups counted."""

    oom_kills: int = 0
    forks_refused: int = 0
    cpu_s: float | None = None
    peak_memory_mb: float | None = None
    processes: int | None = None
    """Processes in the call's cgroup now."""

    def since(self, before: Usage) -> Usage:
        """What was counted after `before` was read (the peak is reset separately)."""
        return Usage(
            oom_kills=self.oom_kills - before.oom_kills,
            forks_refused=self.forks_refused - before.forks_refused,
            cpu_s=self.cpu_s - before.cpu_s
            if self.cpu_s is not None and before.cpu_s is not None
            else None,
            peak_memory_mb=self.peak_memory_mb,
            processes=self.processes,
        )


class CallCgroups:
    """The cgroups of one call: made with limits, joined by its first process, emptied and
    removed when it ends."""

    def __init__(self, layout: CgroupLayout, name: str) -> None:
        self.name = name
        self._dirs: dict[Controller, tuple[Path, bool]] = {
            controller: (place.parent / name, place.v2)
            for controller, place in layout.places.items()
        }

    def create(self, memory_mb: int, max_processes: int, cpus: float | None = None) -> None:
        """Make the cgroups and set their limits (`cpus`: CPUs' worth of time the call may
        use at once, where the host lets it be capped; None: no cap)."""
        for directory, _ in set(self._dirs.values()):
            directory.mkdir(exist_ok=True)
        if "memory" in self._dirs:
            directory, v2 = self._dirs["memory"]
            limit = str(memory_mb * 1024 * 1024)
            if v2:
                (directory / "memory.max").write_text(limit)
                _write_if_present(directory / "memory.swap.max", "0")
            else:
                (directory / "memory.limit_in_bytes").write_text(limit)
                _write_if_present(directory / "memory.memsw.limit_in_bytes", limit)
        if "pids" in self._dirs:
            directory, _ = self._dirs["pids"]
            (directory / "pids.max").write_text(str(max_processes))
        if cpus is not None and "cpu_quota" in self._dirs:
            directory, v2 = self._dirs["cpu_quota"]
            quota = max(1000, round(cpus * _CPU_PERIOD_US))
            if v2:
                (directory / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")
            else:
                (directory / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
                (directory / "cpu.cfs_quota_us").write_text(str(quota))

    @classmethod
    def of_process(cls, pid: int) -> CallCgroups:
        """The cgroups a running process is in (a container's, say), to read and reset its
        counters; empty when they are not visible from here. Blocking."""
        try:
            own = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return cls(CgroupLayout("none", {}), "")
        layout = parse_layout(own, Path("/proc/self/mounts").read_text(), "memory pids cpu")
        return cls(CgroupLayout(layout.version, _existing(layout.places)), "")

    def reset_peak(self) -> None:
        """Start measuring peak memory afresh (where the kernel allows it)."""
        if "memory" in self._dirs:
            directory, v2 = self._dirs["memory"]
            _write_if_present(
                directory / ("memory.peak" if v2 else "memory.max_usage_in_bytes"), "0"
            )

    def holds(self, pid: int) -> bool:
        """Whether the process is in every cgroup of the call."""
        return all(
            str(pid) in (directory / "cgroup.procs").read_text().split()
            for directory, _ in set(self._dirs.values())
        )

    def join(self, pid: int) -> None:
        """Move a process (not yet running the command) into every cgroup of the call."""
        for directory, _ in set(self._dirs.values()):
            (directory / "cgroup.procs").write_text(str(pid))

    def usage(self) -> Usage:
        """The counters now."""
        oom_kills = forks_refused = 0
        cpu_s = peak = None
        processes = None
        if "memory" in self._dirs:
            directory, v2 = self._dirs["memory"]
            counters = _counters(directory / ("memory.events" if v2 else "memory.oom_control"))
            oom_kills = counters.get("oom_kill", 0)
            peak_bytes = _number(directory / ("memory.peak" if v2 else "memory.max_usage_in_bytes"))
            peak = peak_bytes / (1024 * 1024) if peak_bytes is not None else None
        if "pids" in self._dirs:
            directory, _ = self._dirs["pids"]
            forks_refused = _counters(directory / "pids.events").get("max", 0)
            processes = _number(directory / "pids.current")
        if "cpu" in self._dirs:
            directory, v2 = self._dirs["cpu"]
            if v2:
                usec = _counters(directory / "cpu.stat").get("usage_usec")
                cpu_s = usec / 1e6 if usec is not None else None
            else:
                nanoseconds = _number(directory / "cpuacct.usage")
                cpu_s = nanoseconds / 1e9 if nanoseconds is not None else None
        return Usage(oom_kills, forks_refused, cpu_s, peak, processes)

    def kill_all(self, sparing: frozenset[int] = frozenset()) -> bool:
        """SIGKILL every process in the call's cgroups but those `sparing`, and wait until
        they have left them (a killed process stays listed until it has finished exiting);
        whether they did. Blocking."""
        deadline = time.monotonic() + _KILL_WAIT_S
        killed: set[int] = set()
        while True:
            pids = self.members() - sparing
            # A process leaves its cgroup a moment before it is dead (a zombie).
            killed = {pid for pid in killed | pids if alive(pid)}
            if not pids and not killed:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def remove(self) -> bool:
        """Remove the cgroups; whether all are gone. A cgroup whose last process is still
        exiting is busy for a moment: call again."""
        gone = True
        for directory, _ in set(self._dirs.values()):
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                gone = False
        return gone

    @property
    def visible(self) -> bool:
        """Whether any of the cgroups can be read from here."""
        return bool(self._dirs)

    def members(self) -> set[int]:
        """Host pids of the processes in the cgroups."""
        pids: set[int] = set()
        for directory, _ in set(self._dirs.values()):
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(pid) for pid in (directory / "cgroup.procs").read_text().split())
        return pids


def alive(pid: int) -> bool:
    """Whether the process exists and has not exited (zombies have)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _existing(places: dict[Controller, Place]) -> dict[Controller, Place]:
    return {controller: place for controller, place in places.items() if place.parent.is_dir()}


def _write_if_present(path: Path, value: str) -> None:
    # OSError: a v2 memory.peak that cannot be reset yet (before Linux 6.12).
    with contextlib.suppress(OSError):
        path.write_text(value)


def _counters(path: Path) -> dict[str, int]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    counters: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            counters[key] = int(value)
    return counters


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
