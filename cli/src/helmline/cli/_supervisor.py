"""The supervisor of an embedded stack: the process that starts every service process and
starts it again when it exits.

`helmline up` starts the supervisor (`helmline supervise`, detached) and hands it the plan
of what to run on its standard input, so that no service's environment (credentials among
it) is written to disk. The supervisor notices an exit at once (a pidfd of each process, no
polling), records it in the stack record (exit code, restarts, last start; what `helmline
status` shows) and starts the process again on the same ports, after a back-off that grows
while the process keeps dying young. SIGTERM stops it: no more restarts, every service
process is stopped within the grace period.

Processes that another supervisor started (one that died) are adopted: watched the same
way, though how they exit cannot be known (they are not this process's children).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from helmline.cli._processes import find_process, record_of, spawn, stop_processes
from helmline.cli._record import (
    ComponentRecord,
    ProcessRecord,
    StackRecord,
    read_record,
    update_record,
)

logger = logging.getLogger("helmline.supervisor")

FIRST_DELAY_S = 0.25
"""How long a process that died after a stable run waits to be started again."""
MAX_DELAY_S = 30.0
"""The longest back-off of a process that keeps dying."""
STABLE_AFTER_S = 30.0
"""A process that ran this long before it died starts its back-off afresh."""

ComponentChange = Callable[[ComponentRecord], ComponentRecord]


class ServiceLaunch(BaseModel):
    """How to start one service process."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Its component name: the service's, or `planner-2` for a second replica."""
    service: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    health_port: int
    address: str


class SupervisorPlan(BaseModel):
    """Everything the supervisor runs, handed to it on standard input."""

    model_config = ConfigDict(frozen=True)

    data_dir: Path
    services: list[ServiceLaunch]
    grace_s: float
    """How long a stopping service may take before it is killed."""


def restart_delay(young_deaths: int) -> float:
    """Back-off before the next start of a process that died `young_deaths` times in a row
    without a stable run: 0.25 s, 0.5, 1, 2 ... up to 30 s."""
    return float(min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** max(0, young_deaths - 1)))


@dataclass
class _Watched:
    launch: ServiceLaunch
    record: ProcessRecord
    child: subprocess.Popen[bytes] | None
    """None for an adopted process, whose exit status cannot be read."""
    started: float
    pidfd: int


class Supervisor:
    """Runs the plan's services until SIGTERM or SIGINT."""

    def __init__(self, plan: SupervisorPlan) -> None:
        self._plan = plan
        self._poller = select.poll()
        self._watched: dict[int, _Watched] = {}
        self._young_deaths: dict[str, int] = {}
        self._due: dict[str, float] = {}
        self._stopping = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)

    def run(self) -> int:
        signal.set_wakeup_fd(self._wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        self._poller.register(self._wake_read, select.POLLIN)
        for launch in self._plan.services:
            self._adopt_or_start(launch)
        while not self._stopping:
            timeout = self._next_due_in()
            for fd, _ in self._poller.poll(None if timeout is None else max(0, timeout) * 1000):
                if fd == self._wake_read:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_read, 512)
                elif fd in self._watched:
                    self._exited(self._watched.pop(fd))
            now = time.monotonic()
            for name, when in list(self._due.items()):
                if when <= now and not self._stopping:
                    del self._due[name]
                    self._start(self._launch(name), restart=True)
        self._stop_all()
        return 0

    def _stop(self, signum: int, frame: object) -> None:
        self._stopping = True

    def _launch(self, name: str) -> ServiceLaunch:
        return next(launch for launch in self._plan.services if launch.name == name)

    def _next_due_in(self) -> float | None:
        if not self._due:
            return None
        return min(self._due.values()) - time.monotonic()

    def _adopt_or_start(self, launch: ServiceLaunch) -> None:
        existing = _recorded_process(self._plan.data_dir, launch.name)
        if existing is not None and find_process(existing) is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watch(launch, existing, None)
                logger.info("%s: adopted pid %d", launch.name, existing.pid)
                return
        self._start(launch, restart=existing is not None)

    def _start(self, launch: ServiceLaunch, *, restart: bool) -> None:
        child = spawn(launch.argv, log=launch.log, env=launch.env, cwd=launch.cwd)
        record = record_of(child)
        self._watch(launch, record, child)
        logger.info("%s: started pid %d%s", launch.name, child.pid, " (restart)" if restart else "")

        def started(component: ComponentRecord) -> ComponentRecord:
            return component.model_copy(
                update={
                    "process": record,
                    "restarts": component.restarts + (1 if restart else 0),
                    "last_start": datetime.now(UTC),
                }
            )

        _change_component(self._plan.data_dir, launch, started)

    def _watch(
        self, launch: ServiceLaunch, record: ProcessRecord, child: subprocess.Popen[bytes] | None
    ) -> None:
        pidfd = os.pidfd_open(record.pid)
        self._watched[pidfd] = _Watched(launch, record, child, time.monotonic(), pidfd)
        self._poller.register(pidfd, select.POLLIN)

    def _exited(self, watched: _Watched) -> None:
        self._poller.unregister(watched.pidfd)
        os.close(watched.pidfd)
        code = watched.child.wait() if watched.child is not None else None
        if self._stopping:
            return
        name = watched.launch.name
        lived = time.monotonic() - watched.started
        young = self._young_deaths.get(name, 0) + 1 if lived < STABLE_AFTER_S else 1
        self._young_deaths[name] = young
        delay = restart_delay(young)
        self._due[name] = time.monotonic() + delay
        logger.warning(
            "%s: pid %d exited (%s) after %.1f s; starting it again in %.2f s",
            name,
            watched.record.pid,
            "unknown status" if code is None else f"exit {code}",
            lived,
            delay,
        )
        _change_component(
            self._plan.data_dir,
            watched.launch,
            lambda component: component.model_copy(update={"last_exit_code": code}),
        )

    def _stop_all(self) -> None:
        records = [watched.record for watched in self._watched.values()]
        stop_processes(records, grace=self._plan.grace_s, whole_group=True)
        for watched in self._watched.values():
            if watched.child is not None:
                watched.child.wait()
            os.close(watched.pidfd)
        self._watched.clear()


def _recorded_process(data_dir: Path, name: str) -> ProcessRecord | None:
    record = read_record(data_dir)
    if record is None:
        return None
    return next((c.process for c in record.components if c.name == name), None)


def _change_component(data_dir: Path, launch: ServiceLaunch, change: ComponentChange) -> None:
    def changed(record: StackRecord) -> StackRecord:
        current = next(
            (c for c in record.components if c.name == launch.name),
            ComponentRecord(
                name=launch.name,
                kind="service",
                service=launch.service,
                address=launch.address,
                health_port=launch.health_port,
                log=launch.log,
            ),
        )
        return record.with_component(change(current))

    update_record(data_dir, changed)


def main() -> int:
    """`helmline supervise`: read the plan from standard input and supervise it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    plan = SupervisorPlan.model_validate_json(sys.stdin.buffer.read())
    return Supervisor(plan).run()
