"""The planner's own cost in a goal session, the model aside; and a model call's round trip.

A 20-step act-mode session runs against the scripted model (a real HTTP server on this
machine) over an in-memory log, then is shadow-replayed: the replay makes no HTTP calls, so
its time per model call is the planner's own work (folding the log, building the request
within the context budget, reading the answer).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from helmline.contracts import BUILTIN_TOOLS, ModelExchangeRecorded
from helmline.planner import PlannerSettings, shadow_replay
from helmline.planner._engine import GoalEngine
from helmline.planner._providers import model_client
from helmline.planner.testing import InMemoryWorld, Received, Reply, ScriptedModel

STEPS = 20
ROUNDS = 5


def _twenty(received: Received) -> Reply:
    done = sum(1 for text in received.texts() if "succeeded" in text)
    if done < STEPS:
        return Reply.call("echo", message=f"part {done + 1}")
    return Reply.call("finish", summary="done", criteria=[{"criterion": "all", "met": True}])


async def run() -> list[dict[str, Any]]:
    with ScriptedModel() as model:
        model.script("bench", _twenty)
        settings = PlannerSettings(llm_base_url=model.openai_url, llm_model="scripted-1")
        client = model_client(settings)
        sessions, replays = [], []
        try:
            for _ in range(ROUNDS):
                engine = GoalEngine(settings, client, lambda: BUILTIN_TOOLS)
                started = time.perf_counter()
                log = await InMemoryWorld(engine).run("bench: say 20 parts")
                sessions.append(time.perf_counter() - started)
                started = time.perf_counter()
                report = await shadow_replay(log, settings, BUILTIN_TOOLS)
                replays.append(time.perf_counter() - started)
                assert not report.divergences, report.divergences
        finally:
            await client.aclose()
    calls = sum(1 for e in log if isinstance(e.data, ModelExchangeRecorded))
    model_ms = [e.data.duration_ms for e in log if isinstance(e.data, ModelExchangeRecorded)]
    return [
        {
            "figure": "goal session, 20 act steps, scripted model over HTTP, in-memory log",
            "p50_ms": round(statistics.median(sessions) * 1000, 1),
            "model_calls": calls,
        },
        {
            "figure": "planner work per model call (shadow replay of that session)",
            "p50_ms": round(statistics.median(replays) * 1000 / calls, 3),
        },
        {
            "figure": "model call round trip through the OpenAI client (localhost)",
            "p50_ms": round(statistics.median(model_ms), 3),
        },
    ]
