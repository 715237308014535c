"""`make bench`: run every benchmark and print one JSON line per figure.

Figures are measured, never asserted: the machines are shared and noisy, so compare
figures of one run with each other (each line carries its target for reference).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import approval
import gateway
import idle_memory
import observability
import planner
import read_model
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
    "approval": approval.run,
    "sandbox": sandbox.run,
    "gateway": gateway.run,
    "read_model": read_model.rebuild,
    "planner": planner.run,
    "sse": sse.run,
}


ON_ASYNCIO = frozenset({"sandbox"})
"""Benchmarks of services that run on asyncio's event loop (the sandbox); the others run on
uvloop, as the other services do: what runs in this process (the gateway's handler, a
replay, a rebuild, the sandbox's launches) is measured on the loop its service runs it on."""


def main(selected: list[str]) -> None:
    for name in selected or list(BENCHMARKS):
        run = asyncio.run if name in ON_ASYNCIO else uvloop.run
        for figure in run(BENCHMARKS[name]()):
            print(json.dumps({"bench": name, **figure}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
