"""`run_command true` through the process backend (bubblewrap, cgroups, rlimits), through
the container backend (on a private dockerd, where one can start) and without a sandbox, and
the snapshot cost of an unchanged 1,000-file workspace."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nats

from helmline.contracts import SandboxExecutionRequested
from helmline.runtime import ensure_topology
from helmline.runtime.testing import NatsServer
from helmline.sandbox import SandboxSettings, Tools, tools_for
from helmline.sandbox._commands import MARKER_VARIABLE, CommandControl, Reaper
from helmline.sandbox._confinement import Confinement, bwrap_argv
from helmline.sandbox._containers import ContainerBackend
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._snapshots import WorkspaceSnapshots
from helmline.sandbox.testing import EngineUnavailable, PrivateDockerd

CALLS = 200
CONTAINER_CALLS = 50
FILES = 1_000
SNAPSHOTS = 30


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _true_ms(tools: Tools, workspace: Path, calls: int = CALLS) -> list[float]:
    """Milliseconds per `run_command true`, at the executor: no event log around it."""
    reaper = Reaper()
    samples = []
    for i in range(calls + 10):
        request = SandboxExecutionRequested(
            call_id=f"c{i}", step_id="s", tool="run_command", arguments={"command": "true"}
        )
        control = CommandControl(uuid.uuid4().hex, asyncio.Event(), reaper)
        began = time.perf_counter()
        await tools.execute(request, workspace, ("bench", "sandbox"), control)
        samples.append((time.perf_counter() - began) * 1000)
    return samples[10:]  # The first calls warm caches up.


def _figure(name: str, samples: list[float], target: str) -> dict[str, Any]:
    return {
        "figure": name,
        "calls": len(samples),
        "value": round(statistics.median(samples), 2),
        "p99": round(_percentile(samples, 0.99), 2),
        "target": target,
    }


async def _snapshot_figures() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder, NatsServer(Path(folder)) as server:
        connection = await nats.connect(server.url)
        js = connection.jetstream()
        await ensure_topology(js)
        workspace = Path(folder) / "workspace"
        for i in range(FILES):
            file = workspace / f"d{i % 20}" / f"f{i}.txt"
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(f"file {i}\n" * 10)
        snapshots = WorkspaceSnapshots(js, max_bytes=1 << 30)
        began = time.perf_counter()
        first = await snapshots.take(workspace, "bench", "snap", "first")
        first_ms = (time.perf_counter() - began) * 1000
        samples = []
        for i in range(SNAPSHOTS):
            began = time.perf_counter()
            again = await snapshots.take(workspace, "bench", "snap", f"s{i}")
            samples.append((time.perf_counter() - began) * 1000)
            assert again.uploaded_bytes == 0
        await connection.close()
    assert first.files == FILES
    return [
        {
            **_figure("snapshot_unchanged_1000_files_ms", samples, "<= 100 ms"),
            "files": FILES,
            "first_snapshot_ms": round(first_ms, 1),
        }
    ]


def _bwrap_alone_ms(workspace: Path) -> list[float]:
    """The same bubblewrap command line run bare (no cgroups, rlimits or event loop): the
    floor the process backend stands on."""
    workspace.mkdir()
    argv = bwrap_argv(
        shutil.which("bwrap") or "bwrap",
        Confinement(workspace, False, 65534, 8),
        "true",
        MARKER_VARIABLE,
    )
    samples = []
    for _ in range(CALLS):
        began = time.perf_counter()
        subprocess.run(argv, check=True, env={})
        samples.append((time.perf_counter() - began) * 1000)
    return samples


async def run() -> list[dict[str, Any]]:
    figures = []
    with tempfile.TemporaryDirectory() as folder:
        process = await tools_for(SandboxSettings())
        samples = await _true_ms(process, Path(folder) / "process")
        figures.append(_figure("run_command_true_process_backend_ms", samples, "p50 <= 10 ms"))
        samples = await asyncio.to_thread(_bwrap_alone_ms, Path(folder) / "bare")
        figures.append(_figure("bwrap_true_alone_ms", samples, "for comparison (~8 ms idle)"))
        unsandboxed = await tools_for(SandboxSettings(sandbox_backend="unsandboxed"))
        samples = await _true_ms(unsandboxed, Path(folder) / "unsandboxed")
        figures.append(_figure("run_command_true_unsandboxed_ms", samples, "for comparison"))
        figures.append(await _container_figure(Path(folder) / "container"))
    return figures + await _snapshot_figures()


async def _container_figure(workspace: Path) -> dict[str, Any]:
    """`run_command true` through the container backend, on a private dockerd started here
    (a warm container per session, an exec per call)."""
    name, target = "run_command_true_container_backend_ms", "p50 <= 250 ms"
    try:
        with PrivateDockerd() as engine:
            image = engine.import_busybox()
            profile = SandboxProfile(backend="container", image=image)
            backend = await ContainerBackend.start(engine.client(), profile, SandboxSettings())
            defaults = (await tools_for(SandboxSettings())).defaults
            try:
                samples = await _true_ms(Tools(backend, defaults), workspace, calls=CONTAINER_CALLS)
            finally:
                await backend.close()
    except EngineUnavailable as error:
        return {"figure": name, "skipped": str(error), "target": target}
    return _figure(name, samples, target)
