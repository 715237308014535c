"""Where a hop's time goes, measured in the running services under the step bench.

Every service times each event it handles by phase (`helmline_hop_phase_seconds`, see
`helmline.runtime._phases` for what each phase covers and where it is measured). This bench
runs the step bench's sequential sessions on a real stack, scrapes each service's `/metrics`
before and after them (so the warm-up and the services' start count for nothing), and prints
per service and consumer the p50 and mean of each phase in microseconds, and the mean hop:
the sum of the phases' means (medians do not add up).

A p50 is read from the histogram's buckets (three a decade), interpolated within its
bucket as Prometheus' `histogram_quantile` does: good to the bucket's width, no better.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from steps import SERVICES, echo_chain, run_sessions, services_running

from helmline.runtime import Durability

STEPS = 200
SESSIONS = 2
METRIC = "helmline_hop_phase_seconds"
PHASES = ("wait", "queue", "decode", "admit", "read", "fold", "decide", "encode", "append", "ack")

Histograms = dict[tuple[str, str], dict[str, float]]
"""(consumer, phase) to its samples: "count", "sum" and each bucket's upper bound as text."""


def scrape(port: int) -> Histograms:
    """The hop phase histograms a service's `/metrics` shows now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: Histograms = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            key = (sample.labels["consumer"], sample.labels["phase"])
            kind = sample.name.removeprefix(METRIC + "_")
            if kind == "bucket":
                found[key][sample.labels["le"]] = sample.value
            elif kind in ("count", "sum"):
                found[key][kind] = sample.value
    return found


def median_s(buckets: dict[str, float]) -> float:
    """The median of a histogram's cumulative buckets, interpolated within its bucket."""
    bounds = sorted((float(le), count) for le, count in buckets.items() if le != "+Inf")
    total = buckets.get("+Inf", 0.0)
    if total <= 0:
        return 0.0
    rank = total / 2
    lower, below = 0.0, 0.0
    for upper, cumulative in bounds:
        if cumulative >= rank:
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = upper, cumulative
    return lower


def breakdown(before: Histograms, after: Histograms) -> dict[str, dict[str, Any]]:
    """Per consumer: its hops, each phase's p50 and mean in microseconds, and the mean hop."""
    consumers: dict[str, dict[str, Any]] = {}
    for consumer in sorted({consumer for consumer, _ in after}):
        phases: dict[str, dict[str, float]] = {}
        hops = 0.0
        for phase in PHASES:
            late = after.get((consumer, phase), {})
            early = before.get((consumer, phase), {})
            delta = {key: value - early.get(key, 0.0) for key, value in late.items()}
            hops = delta.get("count", 0.0)
            if hops <= 0:
                continue
            phases[phase] = {
                "p50": round(
                    median_s({k: v for k, v in delta.items() if k not in ("count", "sum")}) * 1e6, 1
                ),
                "mean": round(delta["sum"] / hops * 1e6, 1),
            }
        if phases:
            consumers[consumer] = {
                "hops": int(hops),
                "phases_us": phases,
                "mean_hop_us": round(sum(figures["mean"] for figures in phases.values()), 1),
            }
    return consumers


async def run(durability: Durability = "durable") -> list[dict[str, Any]]:
    async with services_running(durability) as (nc, store, services):
        await run_sessions(nc, store, "warmup", [echo_chain(5)])
        before = {name: await asyncio.to_thread(scrape, services.ports[name]) for name in SERVICES}
        for _ in range(SESSIONS):
            await run_sessions(nc, store, "sequential", [echo_chain(STEPS)])
        after = {name: await asyncio.to_thread(scrape, services.ports[name]) for name in SERVICES}
    return [
        {
            "figure": "hop_phases_us",
            "sessions": SESSIONS,
            "steps": SESSIONS * STEPS,
            "services": {name: breakdown(before[name], after[name]) for name in SERVICES},
            "target": "none: where a step's time goes, to choose what to make faster",
        }
    ]
