"""Cost that must stay flat as a session grows: one long session through every service as
its own process, its first 100 steps against its last 100.

4,500 steps: a playbook travels in its `session.started`, and one of 5,000 echo steps
(1.06 MB since a step carries its taint) is larger than an event may be (1 MiB); its log
holds about 18,000 events."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from steps import echo_chain, run_sessions, services_running

from helmline.contracts import StepScheduled

LONG_SESSION_STEPS = 4_500
EDGE = 100
"""Steps compared at each end of the session."""


async def run() -> list[dict[str, Any]]:
    async with services_running() as (nc, store, _):
        (session_id,), _ = await run_sessions(nc, store, "growth", [echo_chain(LONG_SESSION_STEPS)])
        log = await store.read_all("growth", session_id)
    scheduled = [s.event.time for s in log if isinstance(s.event.data, StepScheduled)]
    steps_ms = [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(scheduled)]
    first = statistics.median(steps_ms[:EDGE])
    last = statistics.median(steps_ms[-EDGE:])
    return [
        {
            "figure": "long_session_step_ms",
            "steps": len(scheduled),
            "first_100_p50": round(first, 3),
            "last_100_p50": round(last, 3),
            "ratio": round(last / first, 2),
            "events": len(log),
            "target": "flat: the last 100 steps cost the same as the first 100 (ratio ~1)",
        }
    ]
