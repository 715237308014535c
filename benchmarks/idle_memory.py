"""Resident memory of the whole embedded stack, idle, with every service in its own process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

SETTLE_S = 3.0  # Let start-up garbage be collected before sampling an idle stack.
HELMLINE = str(Path(sys.executable).with_name("helmline"))


def resident_mib(pid: int) -> float:
    """RSS of a process and all its children (PostgreSQL forks a process per duty)."""
    process = psutil.Process(pid)
    processes = [process, *process.children(recursive=True)]
    return sum(p.memory_info().rss for p in processes) / (1 << 20)


async def run() -> list[dict[str, Any]]:
    return await asyncio.to_thread(measure)


def measure() -> list[dict[str, Any]]:
    """Start a stack in a temporary data folder, sample it idle, stop it."""
    with tempfile.TemporaryDirectory() as folder:
        data_dir = Path(folder) / "stack"
        subprocess.run(
            [HELMLINE, "up", "--data-dir", str(data_dir)],
            check=True,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        try:
            time.sleep(SETTLE_S)
            record = json.loads((data_dir / "stack.json").read_text())
            figures = {
                component["name"]: resident_mib(component["process"]["pid"])
                for component in record["components"]
                if component.get("process")
            }
        finally:
            subprocess.run(
                [HELMLINE, "down", "--data-dir", str(data_dir)], check=True, capture_output=True
            )
    services = {name: mib for name, mib in figures.items() if name not in ("nats", "postgres")}
    lines: list[dict[str, Any]] = [
        {
            "figure": "idle_stack_rss_mib",
            "value": round(sum(figures.values()), 1),
            "target": "<= 1024 MiB",
        }
    ]
    lines += [
        {
            "figure": "idle_service_rss_mib",
            "service": name,
            "value": round(mib, 1),
            "target": "<= 150 MiB",
        }
        for name, mib in sorted(services.items())
    ]
    lines += [
        {"figure": "idle_server_rss_mib", "server": name, "value": round(figures[name], 1)}
        for name in ("nats", "postgres")
        if name in figures
    ]
    return lines
