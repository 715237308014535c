"""`make bench`: run every benchmark and print one JSON line per figure.

Figures are measured, never asserted: the machines are shared and noisy, so compare
figures of one run with each other (each line carries its target for reference). Each line
also says how busy the machine's processors were while its benchmark ran, and how much of
them the hypervisor gave to other machines (`steal_pct`): on a shared host that share alone
can double every latency, so two runs compare only at a similar steal.

Every nats-server here fsyncs each append before acknowledging it, as `helmline up` runs
it; the ring, steps and approval round trip run relaxed too (`RELAXED`), and each line
says which (`durability`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import approval
import burst
import console
import follow
import gateway
import growth
import hops
import idle_memory
import listing
import mcp_instances
import null_services
import observability
import planner
import read_model
import redelivery
import replay
import ring
import rollback
import sandbox
import sse
import steps
import uvloop

Benchmark = Callable[[], Awaitable[list[dict[str, Any]]]]
BENCHMARKS: dict[str, Benchmark] = {
    "replay": replay.run,
    "time_travel": replay.time_travel,
    "rollback": rollback.run,
    "ring": ring.run,
    "steps": steps.run,
    "idle_memory": idle_memory.run,
    "observability": observability.run,
    "null_services": null_services.run,
    "approval": approval.run,
    "sandbox": sandbox.run,
    "gateway": gateway.run,
    "mcp_instances": mcp_instances.run,
    "read_model": read_model.rebuild,
    "planner": planner.run,
    "sse": sse.run,
    "burst": burst.run,
    "growth": growth.run,
    "listing": listing.run,
    "follow": follow.run,
    "hops": hops.run,
    "console": console.run,
    "redelivery": redelivery.run,
}


RELAXED: dict[str, Benchmark] = {
    "ring": functools.partial(ring.run, "relaxed"),
    "steps": functools.partial(steps.run, "relaxed"),
    "approval": functools.partial(approval.round_trip, "relaxed"),
    "hops": functools.partial(hops.run, "relaxed"),
}
"""Benchmarks run a second time against a nats-server that acknowledges before it fsyncs
(JetStream's default), their figures printed beside the durable ones: what durability
costs, measured in one run. Every other figure is durable only (docs/durability.md)."""


ON_ASYNCIO = frozenset({"sandbox", "redelivery"})
"""Benchmarks of services that run on asyncio's event loop (the sandbox, whose handler the
redelivery benchmark measures); the others run on
uvloop, as the other services do: what runs in this process (the gateway's handler, a
replay, a rebuild, the sandbox's launches) is measured on the loop its service runs it on."""


PROCESSOR_TIMES = Path("/proc/stat")
"""Its first line: the processors' time so far in user, nice, system, idle, iowait, irq,
softirq and steal (then guest time, already counted in user)."""


def processor_times() -> list[int] | None:
    """The processors' time so far by kind, where the system tells it (Linux)."""
    try:
        return [int(ticks) for ticks in PROCESSOR_TIMES.read_text().splitlines()[0].split()[1:9]]
    except OSError:
        return None


def machine_during(before: list[int], after: list[int]) -> dict[str, float]:
    """How busy the processors were, and how much of them was stolen, between two readings."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        late - early for early, late in zip(before, after, strict=True)
    )
    total = max(1, user + nice + system + idle + iowait + irq + softirq + steal)
    busy = user + nice + system + irq + softirq
    return {"busy_pct": round(100 * busy / total, 1), "steal_pct": round(100 * steal / total, 1)}


def main(selected: list[str]) -> None:
    for name in selected or list(BENCHMARKS):
        runs = [("durable", BENCHMARKS[name])]
        if name in RELAXED:
            runs.append(("relaxed", RELAXED[name]))
        for durability, benchmark in runs:
            run = asyncio.run if name in ON_ASYNCIO else uvloop.run
            before = processor_times()
            figures = run(benchmark())
            after = processor_times()
            machine = machine_during(before, after) if before and after else {}
            for figure in figures:
                line = {"bench": name, "durability": durability, **figure, "machine": machine}
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
