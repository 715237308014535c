"""Detached processes: starting them, recognising them again later, and stopping them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from helmline.cli._record import ProcessRecord

# psutil derives create times from boot time and clock ticks; allow for rounding only.
_CREATE_TIME_TOLERANCE = 0.05


def spawn_detached(
    argv: Sequence[str], *, log: Path, env: Mapping[str, str], cwd: Path
) -> ProcessRecord:
    """Start `argv` in its own session, so that it outlives `helmline up` and its terminal."""
    return record_of(spawn(argv, log=log, env=env, cwd=cwd))


def spawn(
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str],
    cwd: Path,
    stdin: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session (and process group), its output appended to `log`.

    Whoever keeps the returned object learns its exit status; dropped, the subprocess
    module may reap the process itself (and nobody learns how it ended).
    """
    with log.open("ab") as output:
        return subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )


def record_of(child: subprocess.Popen[bytes]) -> ProcessRecord:
    """How the stack record names a process it started."""
    return ProcessRecord(
        pid=child.pid,
        create_time=psutil.Process(child.pid).create_time(),
        argv=[str(arg) for arg in child.args] if isinstance(child.args, list) else [],
    )


def find_process(record: ProcessRecord) -> psutil.Process | None:
    """The live process `record` describes, or None when it has exited (or its pid was reused)."""
    try:
        process = psutil.Process(record.pid)
        if abs(process.create_time() - record.create_time) > _CREATE_TIME_TOLERANCE:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    return process


def reaped(record: ProcessRecord) -> bool:
    """Whether the process is gone for good: not even a zombie left holding its pid, which
    a program checking its pid file (PostgreSQL's `postmaster.pid`) takes for alive."""
    try:
        process = psutil.Process(record.pid)
        return abs(process.create_time() - record.create_time) > _CREATE_TIME_TOLERANCE
    except psutil.NoSuchProcess:
        return True


def is_running(record: ProcessRecord) -> bool:
    return find_process(record) is not None


def stop_processes(
    records: Sequence[ProcessRecord],
    *,
    grace: float,
    first_signal: signal.Signals = signal.SIGTERM,
    whole_group: bool = False,
) -> None:
    """Signal each live process, wait up to `grace` seconds, then SIGKILL what is left.

    With `whole_group`, the signals go to the process group the process leads (it was
    started in its own session), so that children it spawned stop with it.
    """
    watched: list[ProcessRecord] = []
    for record in records:
        process = find_process(record)
        if process is None:
            continue
        watched.append(record)
        if whole_group:
            watched.extend(_identify(child) for child in _descendants(process))
        _signal(record, first_signal, whole_group=whole_group)
    if wait_until(lambda: not any(map(is_running, watched)), timeout=grace):
        return
    for record in records:
        if is_running(record):
            _signal(record, signal.SIGKILL, whole_group=whole_group)
    for record in watched:
        if is_running(record):
            _signal(record, signal.SIGKILL, whole_group=False)
    wait_until(lambda: not any(map(is_running, watched)), timeout=grace)


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _identify(process: psutil.Process) -> ProcessRecord:
    try:
        return ProcessRecord(pid=process.pid, create_time=process.create_time(), argv=[])
    except psutil.NoSuchProcess:
        return ProcessRecord(pid=process.pid, create_time=0.0, argv=[])


def _signal(record: ProcessRecord, sig: signal.Signals, *, whole_group: bool) -> None:
    # Checked right before signalling: a pid that now names another process is left alone.
    if find_process(record) is None:
        return
    try:
        if whole_group:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(log: Path | None, lines: int = 20) -> str:
    if log is None:
        return ""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log at {log})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"({log} is empty)"


def wait_until(condition: Callable[[], bool], *, timeout: float, interval: float = 0.05) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
