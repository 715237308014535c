"""The goal engine over an in-memory log, with a real provider client asking the scripted
model over HTTP: context budget and compaction, tool selection from a large registry,
limits, and reuse of a recorded answer after a crash."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence

import pytest
from pydantic import JsonValue

from helmline.contracts import (
    BUILTIN_TOOLS,
    Actor,
    ContextCompacted,
    Event,
    ModelExchangeRecorded,
    PlanProposed,
    SessionStarted,
    ToolRegistryPublished,
    ToolSpec,
    fold,
    new_event,
)
from helmline.planner._context import estimate_tokens, schema_tokens
from helmline.planner._engine import GoalEngine
from helmline.planner._providers import model_client
from helmline.planner._settings import PlannerSettings
from helmline.planner.testing import InMemoryWorld, Received, Reply, Responder, ScriptedModel
from helmline.runtime import ToolCatalogue

POLICY = Actor(id="policy", kind="policy")


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


def _settings(model: ScriptedModel, **changes: object) -> PlannerSettings:
    values: dict[str, object] = {
        "llm_base_url": model.openai_url,
        "llm_api_key": "sk-test",
        "llm_model": "scripted-1",
        **changes,
    }
    return PlannerSettings.model_validate(values)


def _numbered(count: int) -> Responder:
    """A model that says `count` parts, one call each, then finishes."""
    asked = itertools.count(1)

    def respond(_: Received) -> Reply:
        turn = next(asked)
        if turn <= count:
            return Reply.call("echo", message=f"part {turn}")
        return Reply.call(
            "finish", summary="all said", criteria=[{"criterion": "said", "met": True}]
        )

    return respond


async def test_with_200_federated_tools_the_model_is_offered_a_bounded_relevant_subset(
    model: ScriptedModel,
) -> None:
    federated = tuple(
        ToolSpec(
            name=f"server{n % 10}__tool_{n}",
            description=f"Does thing number {n} on server {n % 10}.",
            parameters={"type": "object", "properties": {}},
            risk="low",
            executor="gateway",
        )
        for n in range(198)
    ) + tuple(
        ToolSpec(
            name=f"jira__{verb}_ticket",
            description=f"{verb.title()} a Jira ticket.",
            parameters={"type": "object", "properties": {"key": {"type": "string"}}},
            risk="low",
            executor="gateway",
        )
        for verb in ("create", "close")
    )
    catalogue = ToolCatalogue()
    catalogue.apply(ToolRegistryPublished(tools=(*BUILTIN_TOOLS, *federated)))
    assert len(catalogue) == 206
    model.script(
        "jira",
        [
            Reply.call("jira__close_ticket", key="OPS-1"),
            Reply.call("finish", summary="closed", criteria=[{"criterion": "closed", "met": True}]),
        ],
    )
    settings = _settings(model, planner_max_tools=8)
    client = model_client(settings)
    try:
        engine = GoalEngine(settings, client, lambda: tuple(catalogue.values()))
        log = await InMemoryWorld(engine).run("jira: close the ticket OPS-1")
    finally:
        await client.aclose()

    assert fold(log).status == "completed"
    for received in model.received("jira"):
        offered = received.tool_names
        assert len(offered) == 8 + 2  # the subset, plus finish and give_up
        assert {"jira__close_ticket", "jira__create_ticket"} <= set(offered)
    # The tool used stays offered on the next turn.
    assert "jira__close_ticket" in model.received("jira")[1].tool_names


async def test_tool_schemas_stay_within_their_share_and_a_tool_in_use_keeps_its_place(
    model: ScriptedModel,
) -> None:
    def bulky(name: str, description: str) -> ToolSpec:
        fields = {f"field_{n}": {"type": "string", "description": "x" * 60} for n in range(12)}
        return ToolSpec(
            name=name,
            description=description,
            parameters={"type": "object", "properties": fields},
            risk="low",
            executor="gateway",
        )

    registry = (
        *BUILTIN_TOOLS,
        *(bulky(f"crm__report_{n}", f"Report number {n} of the crm.") for n in range(6)),
    )
    model.script(
        "bulky",
        [
            Reply.call("crm__report_5", **{"field_0": "a"}),
            Reply.call("finish", summary="done", criteria=[{"criterion": "read", "met": True}]),
        ],
    )
    settings = _settings(
        model,
        planner_context_tokens=8000,
        llm_max_output_tokens=2000,
        planner_tool_schema_share=0.3,
    )
    client = model_client(settings)
    try:
        engine = GoalEngine(settings, client, lambda: registry)
        log = await InMemoryWorld(engine).run("bulky: read the crm report")
    finally:
        await client.aclose()

    assert fold(log).status == "completed"
    room = int(6000 * 0.3)
    by_name = {tool.name: tool for tool in (*registry, *_control())}
    for received in model.received("bulky"):
        offered = [by_name[name] for name in received.tool_names]
        assert sum(schema_tokens(tool) for tool in offered) <= room
        reports = [t.name for t in offered if t.name.startswith("crm__")]
        assert 0 < len(reports) < 6  # some left out, the most relevant kept
    # The report in use stays offered though others rank as high.
    assert "crm__report_5" in model.received("bulky")[1].tool_names
    requests = [e.data.request for e in log if isinstance(e.data, ModelExchangeRecorded)]
    assert all(request.max_tokens == 2000 for request in requests)


def test_an_answer_reserve_that_leaves_too_little_room_for_the_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="llm_max_output_tokens \\(4096\\) leaves less than"):
        PlannerSettings(planner_context_tokens=5000, llm_max_output_tokens=4096)


def test_a_tool_schema_share_too_small_for_the_control_and_built_in_tools_is_refused() -> None:
    refusal = "planner_tool_schema_share \\(0.05\\) leaves 595 tokens"
    with pytest.raises(ValueError, match=refusal):
        PlannerSettings(planner_tool_schema_share=0.05)


async def test_a_long_session_stays_in_budget_and_compaction_lists_what_it_kept(
    model: ScriptedModel,
) -> None:
    model.script("long", _numbered(30))
    budget = 3000  # for the prompt; the context holds the answer's reserve besides
    settings = _settings(
        model,
        planner_context_tokens=budget + 500,
        llm_max_output_tokens=500,
        planner_max_result_chars=300,
    )
    client = model_client(settings)
    try:
        engine = GoalEngine(settings, client, lambda: BUILTIN_TOOLS)
        log = await InMemoryWorld(engine, output={"text": "x" * 2000}).run("long: say 30 parts")
    finally:
        await client.aclose()

    state = fold(log)
    assert state.status == "completed", state.outcome
    assert len(state.steps) == 30
    requests = [e.data.request for e in log if isinstance(e.data, ModelExchangeRecorded)]
    compactions = [e.data for e in log if isinstance(e.data, ContextCompacted)]
    assert compactions, "a 30-step session with a 3000-token budget must compact"
    for request in requests:
        tools = [t for t in (*BUILTIN_TOOLS, *_control()) if t.name in request.tools]
        assert estimate_tokens(request.system, request.messages, tools) <= budget
    # Every request the model received stayed under the budget on the wire too.
    for received in model.received("long"):
        assert len(json.dumps(received.body)) // 4 <= budget
    last = compactions[-1]
    assert last.tokens_after < last.tokens_before
    # Every step before the compaction is in what it kept: listed, newest last, or counted.
    listed = [fact for fact in last.kept if fact.startswith("t")]
    counted = [int(fact.split()[0]) for fact in last.kept if "earlier steps:" in fact]
    assert sum(counted) + len(listed) == last.turn - 1
    assert listed[-1].startswith(f"t{last.turn - 1} (echo): succeeded")
    # Large results are cut with a marker before the model sees them.
    assert "[truncated: 300 of" in model.received("long")[1].last_result()


def _control() -> Sequence[ToolSpec]:
    from helmline.planner._prompts import CONTROL_TOOLS

    return tuple(CONTROL_TOOLS.values())


async def test_the_session_stops_at_its_limit_of_model_calls(model: ScriptedModel) -> None:
    model.script("endless", _numbered(100))
    settings = _settings(model, planner_max_iterations=5)
    client = model_client(settings)
    try:
        log = await InMemoryWorld(GoalEngine(settings, client, lambda: BUILTIN_TOOLS)).run(
            "endless: go"
        )
    finally:
        await client.aclose()
    state = fold(log)
    assert state.status == "failed"
    assert state.outcome == "stopped: 5 model calls, the limit; 5 of 5 steps had succeeded"
    assert len(model.received("endless")) == 5


async def test_a_recorded_answer_is_acted_on_after_a_restart_without_asking_again(
    model: ScriptedModel,
) -> None:
    model.script("restart", [Reply.call("echo", message="once")])
    settings = _settings(model)
    client = model_client(settings)
    try:
        first = GoalEngine(settings, client, lambda: BUILTIN_TOOLS)
        started = new_event(
            SessionStarted(goal="restart: say once", mode="act", requested_by=Actor(id="ana")),
            tenant="t",
            session_id="s2",
            source="test",
        )
        log = [started]
        crashed: list[Event] = []

        async def crash_after_the_answer(event: Event) -> None:
            crashed.append(event)
            if isinstance(event.data, ModelExchangeRecorded):
                raise KeyboardInterrupt  # killed right after the answer was stored

        with pytest.raises(KeyboardInterrupt):
            await first.handle(started, log, crash_after_the_answer)
        stored = [started, *crashed]  # what the log holds after the crash

        appended: list[Event] = []

        async def append(event: Event) -> None:
            appended.append(event)

        again = GoalEngine(settings, client, lambda: BUILTIN_TOOLS)
        await again.handle(started, list(stored), append)
    finally:
        await client.aclose()

    assert len(model.received("restart")) == 1
    (proposed,) = [e.data for e in appended if isinstance(e.data, PlanProposed)]
    assert proposed.steps[0].arguments == {"message": "once"}


async def test_parallel_tool_calls_become_steps_and_each_call_gets_its_result(
    model: ScriptedModel,
) -> None:
    model.script(
        "both",
        [
            Reply.several(("echo", {"message": "left"}), ("echo", {"message": "right"})),
            Reply.call("finish", summary="both", criteria=[{"criterion": "both", "met": True}]),
        ],
    )
    settings = _settings(model)
    client = model_client(settings)
    try:
        log = await InMemoryWorld(GoalEngine(settings, client, lambda: BUILTIN_TOOLS)).run(
            "both: say"
        )
    finally:
        await client.aclose()

    state = fold(log)
    assert state.status == "completed"
    assert {s.id: s.output for s in state.steps.values()} == {
        "t1.1": {"message": "left"},
        "t1.2": {"message": "right"},
    }
    answers = [m for m in model.received("both")[1].body["messages"] if m["role"] == "tool"]
    assert [json.loads(a["content"].split(": ", 2)[2]) for a in answers] == [
        {"message": "left"},
        {"message": "right"},
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_planned_session_completes_on_either_protocol(
    model: ScriptedModel, provider: str, stream: bool
) -> None:
    model.script(
        "either",
        [
            Reply.call(
                "create_plan",
                text="Two echoes.",
                steps=[
                    {"id": "a", "tool": "echo", "arguments": {"message": "a"}},
                    {
                        "id": "b",
                        "tool": "echo",
                        "arguments": {"message": "b"},
                        "depends_on": ["a"],
                        "requires_approval": True,
                    },
                ],
                completion_criteria=["both said"],
                reasoning="a then b",
                confidence=0.9,
            ),
            Reply.call(
                "finish", summary="said", criteria=[{"criterion": "both said", "met": True}]
            ),
        ],
    )
    url = model.openai_url if provider == "openai" else model.url
    settings = _settings(model, llm_provider=provider, llm_base_url=url, llm_stream=stream)
    client = model_client(settings)
    try:
        engine = GoalEngine(settings, client, lambda: BUILTIN_TOOLS)
        log = await InMemoryWorld(engine).run("either: say a then b", mode="plan")
    finally:
        await client.aclose()

    state = fold(log)
    assert state.status == "completed", state.outcome
    assert [c.criterion for c in state.criteria] == ["both said"]
    assert state.plan_confidence == 0.9
    assert [s.requires_approval for s in state.steps.values()] == [False, True]
    second = model.received("either")[1]
    assert second.protocol == provider
    assert "- b (echo): succeeded" in second.last_result()


async def _session(
    model: ScriptedModel, key: str, replies: Sequence[Reply] | Responder, **changes: object
) -> list[Event]:
    model.script(key, replies)
    settings = _settings(model, **changes)
    client = model_client(settings)
    try:
        engine = GoalEngine(settings, client, lambda: BUILTIN_TOOLS)
        return await InMemoryWorld(engine).run(f"{key}: do it", mode="plan")
    finally:
        await client.aclose()


async def test_a_cycle_of_two_calls_is_a_loop_too(model: ScriptedModel) -> None:
    calls = itertools.cycle(["left", "right"])
    log = await _session(
        model, "cycle", lambda _: Reply.call("echo", message=next(calls)), planner_loop_repeats=3
    )
    state = fold(log)
    assert state.status == "failed"
    assert 'echo {"message": "left"} → echo {"message": "right"} 3 times' in state.outcome
    assert len(state.steps) == 5  # the sixth call would have closed the third cycle


async def test_finish_must_report_every_declared_criterion(model: ScriptedModel) -> None:
    criteria: list[JsonValue] = ["said a", "said b"]
    log = await _session(
        model,
        "criteria",
        [
            Reply.call(
                "create_plan",
                steps=[{"id": "a", "tool": "echo", "arguments": {"message": "a"}}],
                completion_criteria=criteria,
                criteria_required=1,
                reasoning="say a",
            ),
            Reply.call("finish", summary="half", criteria=[{"criterion": "said a", "met": True}]),
            Reply.call(
                "finish",
                summary="half of it",
                criteria=[
                    {"criterion": "said a", "met": True},
                    {"criterion": "said b", "met": False, "evidence": "no step said b"},
                ],
            ),
        ],
    )
    state = fold(log)
    assert state.status == "completed"
    assert state.partial
    assert [(c.criterion, c.met) for c in state.criteria] == [("said a", True), ("said b", False)]
    assert "missing: ['said b']" in model.received("criteria")[2].last_result()


def _finish(*met: bool) -> Reply:
    return Reply.call(
        "finish",
        summary="checked",
        criteria=[{"criterion": f"said {n}", "met": m} for n, m in zip("abc", met, strict=False)],
    )


async def test_a_finish_short_of_the_required_criteria_sends_the_model_back_to_work(
    model: ScriptedModel,
) -> None:
    def step(name: str, seconds: float, *after: str) -> JsonValue:
        arguments: JsonValue = {"message": name}
        return {
            "id": name,
            "tool": "echo",
            "arguments": arguments,
            "depends_on": list(after),
            "estimated_duration_s": seconds,
        }

    log = await _session(
        model,
        "required",
        [
            Reply.call(
                "create_plan",
                steps=[step("a", 2, "c"), step("b", 3, "c"), step("c", 1.5)],
                completion_criteria=["said a", "said b", "said c"],
                criteria_required=2,
                reasoning="say all three",
            ),
            _finish(True, False, False),
            Reply.call(
                "create_plan",
                steps=[{"id": "b", "tool": "echo", "arguments": {"message": "b"}}],
                completion_criteria=["said a", "said b", "said c"],
                criteria_required=2,
            ),
            _finish(True, True, False),
        ],
    )
    state = fold(log)
    assert state.status == "completed"
    assert state.partial
    assert state.criteria_required == 2
    first_plan = next(e.data for e in log if isinstance(e.data, PlanProposed))
    assert first_plan.estimated_duration_s == 4.5  # c, then the longer of a and b
    assert [s.estimated_duration_s for s in first_plan.steps] == [2, 3, 1.5]
    purposes = [e.data.purpose for e in log if isinstance(e.data, ModelExchangeRecorded)]
    assert purposes == ["plan", "verify", "replan", "verify"]
    told = model.received("required")[2].last_result()
    assert "Not finished: 1 of 3 completion criteria met, 2 required" in told
    assert state.plan_estimated_duration_s is None  # the second plan's step has no estimate


@pytest.mark.parametrize(
    ("met", "status", "outcome"),
    [
        ((True, False), "completed", "fell short: 1 of 2 completion criteria met, 2 required"),
        ((False, False), "failed", "fell short: 0 of 2 completion criteria met, 2 required"),
    ],
)
async def test_a_session_stops_after_its_last_check_falls_short(
    model: ScriptedModel, met: tuple[bool, ...], status: str, outcome: str
) -> None:
    plan = Reply.call(
        "create_plan",
        steps=[{"id": "a", "tool": "echo", "arguments": {"message": "a"}}],
        completion_criteria=["said a", "said b"],
    )
    log = await _session(
        model,
        f"short-{status}",
        [plan, _finish(*met), _finish(*met)],
        planner_max_finish_attempts=2,
    )
    state = fold(log)
    assert state.status == status
    assert state.outcome.startswith(f"stopped after 2 checks of the goal {outcome}")
    assert state.partial == (status == "completed")
    assert len(model.received(f"short-{status}")) == 3


async def test_a_plan_may_not_require_more_criteria_than_it_declares(
    model: ScriptedModel,
) -> None:
    plan = Reply.call(
        "create_plan",
        steps=[{"id": "a", "tool": "echo", "arguments": {"message": "a"}}],
        completion_criteria=["said a"],
        criteria_required=2,
    )
    log = await _session(model, "overreach", [plan, plan])
    state = fold(log)
    assert state.status == "failed"
    assert "criteria_required is more than the 1 criteria declared" in state.outcome


async def test_free_text_never_ends_a_session(model: ScriptedModel) -> None:
    log = await _session(model, "chatty", [Reply(text="All done!"), Reply(text="Really done.")])
    state = fold(log)
    assert state.status == "failed"
    assert "the answer called no tool" in state.outcome
    assert "free text does not end the session" in model.received("chatty")[1].last_result()
