"""Policy evaluation with 1,000 rules, and the approval round trip with services as processes.

The round trip runs from a person's decision event being appended to the tool call starting
in the sandbox (`approval.decision_submitted` -> `tool.call.started`), both times as the
events record them; the bench grants each request 50 ms after it is recorded. Those are
three hops (approval, tool gateway, sandbox) through services that sat idle meanwhile. Two
floors of the same run put the figure in context: the ring bench's laps after as long an
idle time (bare JetStream), and the null_services bench (Helmline's runtime, deciding
nothing).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from helmline.approval import Policy, parse_policy
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalRequested,
    PlanStep,
    Playbook,
    SessionStarted,
    ToolCallStarted,
    decode_event,
    event_type_filter,
    new_event,
    parse_event_subject,
)
from helmline.runtime import Durability, EventStore, ensure_topology
from helmline.runtime.testing import NatsServer, ServiceProcesses

RULES = 1_000
DECISIONS = 20_000
ROUND_TRIPS = 100
PERSON_DELAY_S = 0.05
SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
APPROVER = Actor(id="bench-approver", roles=("approver",))

ROUND_TRIP_POLICY = """
rules:
  - name: listing-asks
    tool: list_files
    effect: require_approval
  - name: the-rest
    effect: allow
"""


def spread_policy(rules: int) -> Policy:
    """Rules as a large organisation writes them: per tenant and tool, with argument tests;
    the call measured is decided by the last rule."""
    tools = ("read_file", "write_file", "delete_file", "run_command", "list_files")
    lines = ["rules:"]
    for index in range(rules - 1):
        tool = tools[index % len(tools)]
        lines += [
            f"  - name: r{index}",
            f"    tenant: team-{index % 50}-*",
            f"    tool: {tool}",
            "    role: [developer, sre]",
            "    arguments:",
            (
                f"      command: {{regex: '^deploy-{index}\\b'}}"
                if tool == "run_command"
                else f"      path: {{glob: ['projects/p{index}/**']}}"
            ),
            f"    effect: {('allow', 'deny', 'require_approval')[index % 3]}",
        ]
    lines += ["  - name: last", "    effect: allow"]
    return parse_policy("\n".join(lines).encode(), source="spread")


def same_tool_policy(rules: int) -> Policy:
    """The worst case: every rule names the called tool, so each one's argument test runs."""
    lines = ["rules:"]
    for index in range(rules - 1):
        lines += [
            f"  - name: r{index}",
            "    tool: run_command",
            "    arguments:",
            f"      command: {{regex: '^tool-{index} '}}",
            "    effect: deny",
        ]
    lines += ["  - name: last", "    effect: allow"]
    return parse_policy("\n".join(lines).encode(), source="same-tool")


def per_decision_us(
    policy: Policy, tool: str, arguments: dict[str, Any], deciding_rule: str = "last"
) -> float:
    requester = Actor(id="dev", roles=("developer",))
    at = datetime.now(UTC)
    expected = policy.judge(
        tenant="team-7-a", tool=tool, arguments=arguments, requester=requester, at=at
    )
    assert expected.rule == deciding_rule, expected
    timings = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(DECISIONS):
            policy.judge(
                tenant="team-7-a", tool=tool, arguments=arguments, requester=requester, at=at
            )
        timings.append((time.perf_counter() - began) / DECISIONS * 1e6)
    return min(timings)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def round_trips(folder: Path, count: int, durability: Durability = "durable") -> list[float]:
    """Sessions one after another, each waiting for one approval that the bench grants."""
    policy = folder / "policy.yaml"
    policy.write_text(ROUND_TRIP_POLICY)
    with NatsServer(folder, durability=durability) as server:
        services = ServiceProcesses(server.url, folder)
        os.environ["HELMLINE_POLICY"] = str(policy)
        try:
            for name in SERVICES:
                await asyncio.to_thread(services.start, name)
            nc = await nats.connect(server.url)
            await ensure_topology(nc.jetstream())
            store = EventStore(nc.jetstream())
            ended: asyncio.Queue[str] = asyncio.Queue()

            async def grant(message: Msg) -> None:
                # Nobody answers within 50 ms; what the approval service does on receiving
                # the request (it folds the session once) is thus not counted as the answer's.
                await asyncio.sleep(PERSON_DELAY_S)
                asked = decode_event(message.data)
                assert isinstance(asked.data, ApprovalRequested)
                vote = ApprovalDecisionSubmitted(
                    request_id=asked.data.request_id, decision="grant", decided_by=APPROVER
                )
                # As the CLI and the API record a person's decision: an intent of its own,
                # caused by no event.
                await store.append(
                    new_event(
                        vote, tenant=asked.tenant, session_id=asked.session_id, source="bench"
                    )
                )

            async def on_end(message: Msg) -> None:
                await ended.put(parse_event_subject(message.subject).session_id)

            await nc.subscribe(event_type_filter(ApprovalRequested.TYPE, "rt"), cb=grant)
            for kind in ("session.completed", "session.failed"):
                await nc.subscribe(event_type_filter(kind, "rt"), cb=on_end)
            playbook = Playbook(goal="list", steps=(PlanStep(id="ls", tool="list_files"),))
            gaps_ms: list[float] = []
            for index in range(count + 5):
                session_id = uuid.uuid4().hex
                started = SessionStarted(goal="list", playbook=playbook, requested_by=APPROVER)
                await store.append(
                    new_event(started, tenant="rt", session_id=session_id, source="bench")
                )
                assert await asyncio.wait_for(ended.get(), timeout=60) == session_id
                if index < 5:
                    continue  # Warm-up: first connections, first consumers, caches.
                events = [s.event for s in await store.read_all("rt", session_id)]
                voted = next(e for e in events if isinstance(e.data, ApprovalDecisionSubmitted))
                began = next(e for e in events if isinstance(e.data, ToolCallStarted))
                gaps_ms.append((began.time - voted.time).total_seconds() * 1000)
            await nc.close()
        finally:
            os.environ.pop("HELMLINE_POLICY", None)
            await asyncio.to_thread(services.stop_all)
    return gaps_ms


async def run() -> list[dict[str, Any]]:
    spread = spread_policy(RULES)
    worst = same_tool_policy(RULES)
    figures: list[dict[str, Any]] = [
        {
            "figure": "policy_decision_us",
            "rules": len(spread),
            "case": "rules spread over tenants and tools; decided by the last rule",
            "value": round(per_decision_us(spread, "write_file", {"path": "a.txt"}), 2),
            "target": "<= 100 us",
        },
        {
            "figure": "policy_decision_us",
            "rules": len(worst),
            "case": "every rule on the called tool, no regex found; decided by the last rule",
            "value": round(per_decision_us(worst, "run_command", {"command": "ls -l"}), 2),
            "target": "<= 100 us",
        },
        {
            "figure": "policy_decision_us",
            "rules": len(worst),
            "case": "every rule on the called tool; decided by the regex of the 999th rule",
            "value": round(
                per_decision_us(
                    worst, "run_command", {"command": f"tool-{RULES - 2} x"}, f"r{RULES - 2}"
                ),
                2,
            ),
            "target": "<= 100 us",
        },
    ]
    return [*figures, *await round_trip()]


async def round_trip(durability: Durability = "durable") -> list[dict[str, Any]]:
    """The approval round trip's figure alone."""
    with tempfile.TemporaryDirectory() as folder:
        gaps_ms = await round_trips(Path(folder), ROUND_TRIPS, durability)
    return [
        {
            "figure": "approval_round_trip_ms",
            "approvals": len(gaps_ms),
            "p50": round(statistics.median(gaps_ms), 3),
            "p99": round(percentile(gaps_ms, 0.99), 3),
            "target": "durable: p50 <= 2.9 ms",
        }
    ]
