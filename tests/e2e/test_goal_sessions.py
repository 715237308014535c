"""Goal sessions end to end: the planner asks a scripted model (a real HTTP server speaking the
OpenAI protocol), and every step runs through policy, the tool gateway and the sandbox, each
service in its own process."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import JsonValue

from helmline.contracts import (
    BUILTIN_TOOLS,
    LoopDetected,
    ModelExchangeRecorded,
    PlanProposed,
    SandboxExecutionRequested,
    ToolCallCompleted,
    authorizations,
    tenant_filter,
)
from helmline.planner import PlannerSettings, shadow_replay
from helmline.planner.testing import Received, Reply, Responder, ScriptedModel
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, eventually

from .goal_sessions import ended, log_of, start

HELMLINE = str(Path(sys.executable).with_name("helmline"))
LOOP_REPEATS = 3


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


@pytest.fixture(scope="module")
def stack(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory, model: ScriptedModel
) -> Iterator[ServiceProcesses]:
    running = ServiceProcesses(nats_url, tmp_path_factory.mktemp("goal-stack"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HELMLINE_LLM_BASE_URL", model.openai_url)
        env.setenv("HELMLINE_LLM_API_KEY", "sk-scripted")
        env.setenv("HELMLINE_LLM_MODEL", "scripted-1")
        env.setenv("HELMLINE_LLM_PRICES", '{"scripted-1": [1.0, 2.0]}')
        env.setenv("HELMLINE_PLANNER_LOOP_REPEATS", str(LOOP_REPEATS))
        try:
            for name in ("planner", "approval", "tool_gateway", "sandbox"):
                running.start(name)
            yield running
        finally:
            running.stop_all()


def plan(*steps: dict[str, JsonValue], criteria: tuple[str, ...], reasoning: str = "") -> Reply:
    return Reply.call(
        "create_plan",
        steps=list(steps),
        completion_criteria=list(criteria),
        reasoning=reasoning or "the obvious way",
        confidence=0.8,
    )


def finish(*criteria: str, summary: str = "done") -> Reply:
    return Reply.call(
        "finish",
        summary=summary,
        criteria=[{"criterion": c, "met": True, "evidence": "see the results"} for c in criteria],
    )


async def test_a_goal_is_planned_run_under_policy_and_completed_with_its_criteria(
    stack: ServiceProcesses, model: ScriptedModel, store: EventStore, tenant: str
) -> None:
    criteria = ("notes.txt holds hello", "the note was read back")
    model.script(
        "three-steps",
        [
            plan(
                {
                    "id": "write",
                    "tool": "write_file",
                    "arguments": {"path": "notes.txt", "content": "hello"},
                },
                {
                    "id": "read",
                    "tool": "read_file",
                    "arguments": {"path": "notes.txt"},
                    "depends_on": ["write"],
                },
                {
                    "id": "say",
                    "tool": "echo",
                    "arguments": {"message": "wrote it"},
                    "depends_on": ["read"],
                },
                criteria=criteria,
            ),
            finish(*criteria, summary="the note is written and read back"),
        ],
    )
    session_id = await start(store, tenant, "three-steps: write a note and read it back")
    state = await ended(store, tenant, session_id)

    assert state.status == "completed", state.outcome
    assert [(s.id, s.status) for s in state.steps.values()] == [
        ("write", "succeeded"),
        ("read", "succeeded"),
        ("say", "succeeded"),
    ]
    assert [(c.criterion, c.met) for c in state.criteria] == [(c, True) for c in criteria]
    assert state.outcome == "the note is written and read back"
    # The model saw the results before it declared the goal met.
    second = model.received("three-steps")[1]
    assert "hello" in second.last_result()
    assert "Every step succeeded" in second.last_result()
    log = await log_of(store, tenant, session_id)
    authorized = [call.rule for _, call in authorizations(log)]
    assert authorized == ["allow-low-and-medium-risk"] * 3
    sandboxed = [e.data.tool for e in log if isinstance(e.data, SandboxExecutionRequested)]
    assert sandboxed == ["write_file", "read_file"]
    exchanges = [e.data for e in log if isinstance(e.data, ModelExchangeRecorded)]
    assert [x.purpose for x in exchanges] == ["plan", "verify"]
    assert all(x.reply.usage.input_tokens == 120 for x in exchanges)
    assert state.model_calls == 2
    assert state.tokens_used == 300
    assert state.cost_usd == pytest.approx(2 * (120 * 1.0 + 30 * 2.0) / 1_000_000)
    assert {t.kind for t in state.thoughts} >= {"decision"}


def replan_after(problem: str, then: Reply) -> Responder:
    """A model that plans, and after seeing `problem` in a result replies `then`."""

    def respond(received: Received) -> Reply:
        result = received.last_result()
        if "Goal:" in result and len(received.texts()) == 1:
            return plan(
                {"id": "look", "tool": "read_file", "arguments": {"path": "missing.txt"}},
                criteria=("the answer is known",),
            )
        if problem in result:
            return then
        return finish("the answer is known")

    return respond


async def test_after_a_failed_step_the_model_replans_and_finishes(
    stack: ServiceProcesses, model: ScriptedModel, store: EventStore, tenant: str
) -> None:
    other_way = plan(
        {"id": "ask", "tool": "echo", "arguments": {"message": "42"}},
        criteria=("the answer is known",),
        reasoning="the file is missing, so ask instead",
    )
    model.script("replan-failure", replan_after("failed", other_way))
    session_id = await start(store, tenant, "replan-failure: find the answer")
    state = await ended(store, tenant, session_id)

    assert state.status == "completed", state.outcome
    assert state.steps["look"].status == "failed"
    assert state.steps["t2.ask"].status == "succeeded"
    log = await log_of(store, tenant, session_id)
    plans = [e.data for e in log if isinstance(e.data, PlanProposed)]
    assert [p.revision for p in plans] == [1, 2]
    purposes = [e.data.purpose for e in log if isinstance(e.data, ModelExchangeRecorded)]
    assert purposes == ["plan", "replan", "verify"]
    assert any(t.kind == "reflection" for t in state.thoughts)


async def test_after_a_denial_the_model_chooses_another_way_or_stops_with_a_reason(
    stack: ServiceProcesses, model: ScriptedModel, store: EventStore, tenant: str
) -> None:
    def denied_then(then: Reply) -> Responder:
        def respond(received: Received) -> Reply:
            if len(received.texts()) == 1:
                return plan(
                    {"id": "drop", "tool": "drop_database", "arguments": {"name": "prod"}},
                    criteria=("the old data is gone",),
                )
            if "denied" in received.last_result():
                return then
            return finish("the old data is gone")

        return respond

    another_way = plan(
        {"id": "note", "tool": "echo", "arguments": {"message": "archive it instead"}},
        criteria=("the old data is gone",),
    )
    model.script("deny-another-way", denied_then(another_way))
    model.script(
        "deny-give-up", denied_then(Reply.call("give_up", reason="only a DBA may drop it"))
    )
    another = await start(store, tenant, "deny-another-way: clear the old data")
    stopped = await start(store, tenant, "deny-give-up: clear the old data")

    state = await ended(store, tenant, another)
    assert state.status == "completed", state.outcome
    assert state.steps["drop"].status == "denied"
    assert state.steps["t2.note"].status == "succeeded"
    state = await ended(store, tenant, stopped)
    assert state.status == "failed"
    assert state.outcome == "the planner gave up: only a DBA may drop it"


async def test_malformed_tool_call_json_is_repaired_or_asked_again_once_then_fails(
    stack: ServiceProcesses, model: ScriptedModel, store: EventStore, tenant: str
) -> None:
    done = Reply.call("finish", summary="said", criteria=[{"criterion": "said hi", "met": True}])
    model.script("json-repairable", [Reply.malformed("echo", '{"message": "hi",'), done])
    model.script(
        "json-reask", [Reply.malformed("echo", "{{{"), Reply.call("echo", message="hi"), done]
    )
    model.script(
        "json-hopeless", [Reply.malformed("echo", "{{{"), Reply.malformed("echo", "not json")]
    )
    repairable = await start(store, tenant, "json-repairable: say hi", mode="act")
    reask = await start(store, tenant, "json-reask: say hi", mode="act")
    hopeless = await start(store, tenant, "json-hopeless: say hi", mode="act")

    state = await ended(store, tenant, repairable)
    assert state.status == "completed", state.outcome
    assert state.steps["t1"].output == {"message": "hi"}
    assert any("repaired" in t.text for t in state.thoughts)

    state = await ended(store, tenant, reask)
    assert state.status == "completed", state.outcome
    second = model.received("json-reask")[1]
    assert "not valid JSON" in second.last_result()

    state = await ended(store, tenant, hopeless)
    assert state.status == "failed"
    assert "could not be used, even when asked again" in state.outcome
    assert "not valid JSON" in state.outcome
    assert not state.steps


async def test_a_rate_limited_model_is_asked_again_after_its_retry_after(
    stack: ServiceProcesses, model: ScriptedModel, store: EventStore, tenant: str
) -> None:
    done = Reply.call("finish", summary="ok", criteria=[{"criterion": "said", "met": True}])
    model.script(
        "rate-limited", [Reply.error(429, retry_after="1"), Reply.call("echo", message="x"), done]
    )
    session_id = await start(store, tenant, "rate-limited: say x", mode="act")
    state = await ended(store, tenant, session_id)

    assert state.status == "completed", state.outcome
    first, second = model.received("rate-limited")[:2]
    assert second.at - first.at >= 1.0
    log = await log_of(store, tenant, session_id)
    attempts = [e.data.attempts for e in log if isinstance(e.data, ModelExchangeRecorded)]
    assert attempts == [2, 1]


async def test_a_looping_model_is_stopped_within_the_configured_repeats(
    stack: ServiceProcesses, model: ScriptedModel, store: EventStore, tenant: str
) -> None:
    model.script("looping", lambda _: Reply.call("echo", message="again"))
    session_id = await start(store, tenant, "looping: say it until it sticks", mode="act")
    state = await ended(store, tenant, session_id)

    assert state.status == "failed"
    assert "repeated echo" in state.outcome
    assert len(state.steps) == LOOP_REPEATS - 1  # the repeat that makes the loop never runs
    log = await log_of(store, tenant, session_id)
    (loop,) = [e.data for e in log if isinstance(e.data, LoopDetected)]
    assert loop.repeats == LOOP_REPEATS
    assert loop.calls == ('echo {"message": "again"}',)


async def test_helmline_run_starts_a_goal_session(
    stack: ServiceProcesses, model: ScriptedModel, nats_url: str, store: EventStore, tenant: str
) -> None:
    model.script(
        "from-the-cli",
        [
            Reply.call("echo", message="hello from the cli"),
            Reply.call(
                "finish", summary="greeted", criteria=[{"criterion": "greeted", "met": True}]
            ),
        ],
    )
    process = await asyncio.create_subprocess_exec(
        HELMLINE,
        "run",
        "from-the-cli: greet",
        "--mode",
        "act",
        "--tenant",
        tenant,
        "--wait",
        "--json",
        env={"HELMLINE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, err.decode()
    answer = json.loads(out)
    assert answer["status"] == "completed"
    state = (await store.load(tenant, answer["session_id"])).state
    assert state.mode == "act"
    assert state.steps["t1"].output == {"message": "hello from the cli"}
    shown = await asyncio.create_subprocess_exec(
        HELMLINE,
        "show",
        answer["session_id"],
        "--tenant",
        tenant,
        env={"HELMLINE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(shown.communicate(), timeout=60)
    assert "model (act mode): 2 calls, 300 tokens" in out.decode()
    assert "criterion met: greeted" in out.decode()


async def test_a_shadow_replay_reproduces_a_20_step_session_and_names_a_divergence(
    stack: ServiceProcesses, model: ScriptedModel, nats_url: str, store: EventStore, tenant: str
) -> None:
    def twenty_steps(received: Received) -> Reply:
        done = sum(1 for text in received.texts() if "succeeded" in text)
        if done < 20:
            return Reply.call("echo", text=f"step {done + 1} of 20", message=f"part {done + 1}")
        return Reply.call(
            "finish", summary="20 parts said", criteria=[{"criterion": "20 parts", "met": True}]
        )

    model.script("twenty", twenty_steps)
    session_id = await start(store, tenant, "twenty: say the 20 parts", mode="act")
    state = await ended(store, tenant, session_id)
    assert state.status == "completed", state.outcome
    assert len(state.steps) == 20
    recording = await log_of(store, tenant, session_id)
    calls_before = len(model.received("twenty"))
    tenant_events = len(await store.read_matching(tenant_filter(tenant)))

    settings = PlannerSettings(planner_loop_repeats=LOOP_REPEATS)
    same = await shadow_replay(recording, settings, BUILTIN_TOOLS)
    assert same.divergences == []
    assert (same.model_calls, same.steps, same.side_effects) == (21, 20, 0)
    assert same.shadow_status == same.recorded_status == "completed"

    changed = await shadow_replay(
        recording,
        PlannerSettings(planner_loop_repeats=LOOP_REPEATS, planner_system_prompt="Be brief."),
        BUILTIN_TOOLS,
    )
    (divergence,) = changed.divergences
    assert divergence.where == "model call 1"
    assert divergence.step == "t1"
    assert "Be brief." in divergence.shadow

    # Through the command: no divergence, and nothing was run or appended by any replay.
    process = await asyncio.create_subprocess_exec(
        HELMLINE,
        "replay",
        session_id,
        "--shadow",
        "--tenant",
        tenant,
        "--json",
        env={
            "HELMLINE_NATS_URL": nats_url,
            "PATH": "/usr/bin:/bin",
            "HELMLINE_PLANNER_LOOP_REPEATS": str(LOOP_REPEATS),
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, err.decode() + out.decode()
    assert json.loads(out)["divergences"] == []
    assert len(model.received("twenty")) == calls_before
    assert len(await store.read_matching(tenant_filter(tenant))) == tenant_events


async def test_a_planner_killed_while_the_model_thinks_asks_again_and_runs_each_step_once(
    stack: ServiceProcesses, model: ScriptedModel, store: EventStore, tenant: str
) -> None:
    thinking = threading.Event()
    asked = itertools.count(1)

    def respond(_: Received) -> Reply:
        turn = next(asked)
        if turn == 2:
            thinking.wait(timeout=60)  # the planner is killed while this answer is pending
        if turn <= 3:
            return Reply.call("echo", message=f"part {min(turn, 2)}")
        return Reply.call("finish", summary="said", criteria=[{"criterion": "said", "met": True}])

    model.script("killed", respond)
    session_id = await start(store, tenant, "killed: say two parts", mode="act")
    await eventually(lambda: len(model.received("killed")) == 2, what="the second model call")
    stack.kill("planner")
    thinking.set()
    await asyncio.to_thread(stack.start, "planner")
    state = await ended(store, tenant, session_id)

    assert state.status == "completed", state.outcome
    log = await log_of(store, tenant, session_id)
    ran = [e.data.step_id for e in log if isinstance(e.data, ToolCallCompleted)]
    assert ran == ["t1", "t2"]
    turns = [e.data.turn for e in log if isinstance(e.data, ModelExchangeRecorded)]
    assert turns == [1, 2, 3]  # the lost answer was asked again, and recorded once
