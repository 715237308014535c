"""`make bench`: run every benchmark and print one JSON line per figure.

Figures are measured, never asserted: the machines are shared and noisy, so compare
figures of one run with each other (each line carries its target for reference).
"""

from __future__ import annotations

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


async def main(selected: list[str]) -> None:
    for name in selected or list(BENCHMARKS):
        for figure in await BENCHMARKS[name]():
            print(json.dumps({"bench": name, **figure}), flush=True)


if __name__ == "__main__":
    # On the event loop the services run on (helmline.runtime.run_service): what runs in this
    # process (the gateway's handler, a replay, a rebuild) is measured as a service runs it.
    uvloop.run(main(sys.argv[1:]))
