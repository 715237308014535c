"""Goal sessions, decided purely: when to ask the model, what to ask, what its answer means.

A goal session (mode `plan` or `act`) runs on the same machinery as a playbook: plans are
proposed, approved by policy, and their steps scheduled by `_domain`. What differs is who
writes the plans and who says "done": the model, through the control tools. Everything here
is a function of the session's log, so a restarted planner and a shadow replay reach the
same requests and the same decisions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args
from uuid import UUID

import json_repair
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from helmline.contracts import (
    IN_FLIGHT_STEPS,
    ContextCompacted,
    CriterionResult,
    Event,
    LoopDetected,
    ModelExchangeRecorded,
    ModelMessage,
    ModelRequestRecord,
    ModelToolCall,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    PlanStep,
    SessionCompleted,
    SessionFailed,
    SessionResumeRequested,
    SessionStarted,
    SessionState,
    StepScheduled,
    StepSkipped,
    StepState,
    ThoughtRecorded,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolSpec,
    critical_path_s,
    find_dependency_problem,
)
from helmline.planner._context import (
    CHARS_PER_TOKEN,
    compact,
    compaction_cut,
    estimate_tokens,
    schema_tokens,
    select_tools,
    transcript,
    truncate,
)
from helmline.planner._domain import Decision, decide
from helmline.planner._prompts import (
    CONTROL_TOOLS,
    CREATE_PLAN,
    FINISH,
    GIVE_UP,
    SYSTEM_CLASSIFY,
    control_tools,
    goal_message,
    summarise_prompt,
    system_prompt,
)
from helmline.planner._settings import PlannerSettings
from helmline.planner._spotlight import Spotlight
from helmline.planner._taint import Reading, outside_results, reading, taint_of

Purpose = Literal["plan", "replan", "act", "verify", "repair"]
"""Why the planning model is asked: the turns of the session's conversation."""
Aside = Literal["summarise", "classify"]
"""Why another model is asked, for the conversation's sake: a compaction's account of the
turns it drops (the summarising model), the goal's intent and tools (the classifying one)."""
CONVERSATION: frozenset[str] = frozenset(get_args(Purpose))
CLASSIFY_DESCRIPTION_CHARS = 160
"""Longest description of a tool the classifying model reads."""
CLASSIFY_MAX_TOKENS = 1024
"""Largest answer asked of the classifying model: an intent and a list of tool names."""
PROBLEMS = frozenset({"failed", "denied"})
THOUGHT_CHARS = 2000
FACT_CHARS = 160
"""Longest result a compaction summary keeps of one step."""
SUMMARY_SHARE = 0.25
"""Share of the context budget a compaction summary may take."""


@dataclass(frozen=True, slots=True)
class Reaction:
    """Decisions to append, and whether the model must be asked next (and why)."""

    decisions: list[Decision]
    ask: Purpose | None = None


def react(state: SessionState, log: Sequence[Event], trigger: Event) -> Reaction:
    """The planner's reaction to an event of a goal session; `state` includes the event."""
    if state.is_terminal:
        return Reaction([])
    data = trigger.data
    match data:
        case SessionStarted():
            first: Purpose = "act" if state.mode == "act" else "plan"
            return Reaction([], None if state.model_calls else first)
        case PlanRejected():
            current = data.revision == state.plan_revision
            return Reaction([], "replan" if current else None)
        case PlanApproved():
            current = data.revision == state.plan_revision
            return _carry_on(state, log, trigger, current=current)
        case SessionResumeRequested():
            return _carry_on(state, log, trigger, current=True)
        case ToolCallCompleted() | ToolCallFailed() | ToolCallDenied():
            step = state.steps.get(data.step_id)
            current = step is not None and step.call_id == data.call_id
            return _carry_on(state, log, trigger, current=current)
        case _:
            return Reaction(decide(state, trigger))


def _carry_on(
    state: SessionState, log: Sequence[Event], trigger: Event, *, current: bool
) -> Reaction:
    """Schedule what the plan allows; when nothing is left to run, the model decides."""
    # The playbook logic schedules steps and retries; ending the session is the model's call.
    decisions = [
        d
        for d in decide(state, trigger)
        if not isinstance(d.payload, SessionCompleted | SessionFailed)
    ]
    busy = any(isinstance(d.payload, StepScheduled) for d in decisions) or any(
        s.status in IN_FLIGHT_STEPS for s in state.steps.values()
    )
    if busy or not current or state.pause_requested or state.plan_revision == 0:
        return Reaction(decisions)
    problems = _new_problems(state, log)
    if problems:
        seen = "; ".join(_outcome(state, step.id, 300, None)[2:] for step in problems)
        decisions.append(_thought("observation", seen))
    if state.mode == "act":
        return Reaction(decisions, "act")
    return Reaction(decisions, "replan" if problems else "verify")


def _new_problems(state: SessionState, log: Sequence[Event]) -> list[StepState]:
    """Steps that failed or were denied since the model last spoke."""
    calls = {
        e.data.call_id
        for e in log[_after_last_exchange(log) :]
        if isinstance(e.data, ToolCallFailed | ToolCallDenied)
    }
    return [s for s in state.steps.values() if s.status in PROBLEMS and s.call_id in calls]


def _after_last_exchange(log: Sequence[Event]) -> int:
    for index in range(len(log) - 1, -1, -1):
        if is_turn(log[index]):
            return index + 1
    return 0


def is_turn(event: Event) -> bool:
    """Whether the event records a turn of the conversation (not a summary or a
    classification asked on the side)."""
    data = event.data
    return isinstance(data, ModelExchangeRecorded) and data.purpose in CONVERSATION


def exchanges(log: Sequence[Event]) -> list[Event]:
    """The turns of the session's conversation with the planning model, in order."""
    return [e for e in log if is_turn(e)]


def session_marker(log: Sequence[Event]) -> str | None:
    """The spotlighting marker the session's requests use, once its first turn chose one."""
    return next(
        (
            e.data.spotlight_marker
            for e in log
            if isinstance(e.data, ModelExchangeRecorded) and e.data.spotlight_marker is not None
        ),
        None,
    )


def aside(log: Sequence[Event], purpose: Aside, cause_id: UUID | None) -> Event | None:
    """The recorded exchange of that purpose the event `cause_id` led to (with None, the
    session's first of that purpose)."""
    return next(
        (
            e
            for e in log
            if isinstance(e.data, ModelExchangeRecorded)
            and e.data.purpose == purpose
            and (cause_id is None or e.causation_id == cause_id)
        ),
        None,
    )


# --- limits -------------------------------------------------------------------------------


def limit_reached(
    state: SessionState, settings: PlannerSettings, now: datetime
) -> SessionFailed | None:
    """The end of a session that may not ask the model again, or None when it may."""
    reason = None
    if state.model_calls >= settings.planner_max_iterations:
        reason = f"{state.model_calls} model calls, the limit"
    elif state.tokens_used >= settings.planner_max_tokens:
        reason = f"{state.tokens_used} tokens used, the limit is {settings.planner_max_tokens}"
    elif (
        settings.planner_max_cost_usd is not None
        and state.cost_usd >= settings.planner_max_cost_usd
    ):
        reason = f"${state.cost_usd:.4f} spent, the limit is ${settings.planner_max_cost_usd}"
    elif (
        state.started_at and (now - state.started_at).total_seconds() > settings.planner_max_wall_s
    ):
        reason = f"running longer than {settings.planner_max_wall_s:g} s"
    if reason is None:
        return None
    succeeded = sum(1 for s in state.steps.values() if s.status == "succeeded")
    return SessionFailed(
        reason=f"stopped: {reason}; {succeeded} of {len(state.steps)} steps had succeeded"
    )


# --- the request --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request ready to send, the tools it offers, and a compaction it needed."""

    request: ModelRequestRecord
    tools: list[ToolSpec]
    compaction: ContextCompacted | None
    spotlight_flagged: tuple[str, ...] = ()
    """Steps whose result, new in this request, holds a forged delimiter or the marker."""
    untrusted_read: tuple[str, ...] = ()
    """Calls whose result, new in this request, came from an untrusted tool."""
    summarise: ModelRequestRecord | None = None
    """The summarising model's request, when the compaction waits for its account."""


def prepare(
    state: SessionState,
    log: Sequence[Event],
    registry: Sequence[ToolSpec],
    settings: PlannerSettings,
    spotlight: Spotlight,
    account: ModelExchangeRecorded | None = None,
) -> Prepared:
    """The next request of the session, within its context budget, each tool result in it
    delimited by `spotlight`. When it needs a compaction and no `account` of the dropped
    turns is given (the summarising model's recorded answer), `summarise` is the request
    that asks for one: prepare again with it."""
    messages = _conversation(state, log, exchanges(log), settings, spotlight)
    used = [s.tool for s in state.steps.values()]
    context = [state.goal, *(m.content for m in messages[-3:])]
    budget = settings.prompt_budget()
    controls = control_tools(state.mode)
    schema_room = int(budget * settings.planner_tool_schema_share) - sum(
        schema_tokens(tool) for tool in controls
    )
    picked = classified(log)
    chosen = select_tools(registry, context, used, settings.planner_max_tools, schema_room, picked)
    tools = [*chosen, *controls]
    system = system_prompt(state.mode, settings.planner_system_prompt, spotlight)
    size = estimate_tokens(system, messages, tools)
    compaction = summarise = None
    cut = compaction_cut(messages) if size > settings.planner_compact_at * budget else None
    if cut is not None:
        # Half the summary's room for the log's facts, half for the model's account.
        summary_chars = int(budget * SUMMARY_SHARE * CHARS_PER_TOKEN) // 2
        if account is None:
            summarise = _summarise_request(
                state, messages[1:cut], summary_chars, settings, spotlight
            )
        words = truncate(account.reply.content, summary_chars) if account is not None else ""
        compacted = compact(messages, _facts(state, summary_chars, spotlight), words)
        assert compacted is not None  # `compaction_cut` found turns to drop.
        messages = list(compacted.messages)
        compaction = ContextCompacted(
            turn=state.model_calls + 1,
            budget_tokens=budget,
            tokens_before=size,
            tokens_after=estimate_tokens(system, messages, tools),
            dropped_messages=compacted.dropped,
            kept=compacted.kept,
            summarised_by=account.request.model if account is not None else None,
        )
    request = ModelRequestRecord(
        model=settings.model_for("planning"),
        system=system,
        messages=tuple(messages),
        tools=tuple(tool.name for tool in tools),
        max_tokens=settings.llm_max_output_tokens,
    )
    return Prepared(
        request=request,
        tools=tools,
        compaction=compaction,
        spotlight_flagged=_forged_delimiters(log, spotlight),
        untrusted_read=_untrusted_results(log),
        summarise=summarise,
    )


def _forged_delimiters(log: Sequence[Event], spotlight: Spotlight) -> tuple[str, ...]:
    """Steps whose result arrived since the model last spoke (so is new in the next
    request) and holds the session's marker or a tag of the delimiters' form."""
    return tuple(
        e.data.step_id
        for e in log[_after_last_exchange(log) :]
        if isinstance(e.data, ToolCallCompleted | ToolCallFailed)
        and spotlight.holds_delimiter(_tool_text(e.data))
    )


def _untrusted_results(log: Sequence[Event]) -> tuple[str, ...]:
    """Calls whose result arrived since the model last spoke (so is new in the next
    request) and is outside content (`outside_results`)."""
    outside = outside_results(log)
    return tuple(
        e.data.call_id
        for e in log[_after_last_exchange(log) :]
        if isinstance(e.data, ToolCallCompleted) and e.data.call_id in outside
    )


def _tool_text(result: ToolCallCompleted | ToolCallFailed) -> str:
    """What a tool wrote of a result or failure, as `_outcome` shows it to the model."""
    if isinstance(result, ToolCallFailed):
        return result.error.message
    return json.dumps(result.output)


def _summarise_request(
    state: SessionState,
    dropped: Sequence[ModelMessage],
    summary_chars: int,
    settings: PlannerSettings,
    spotlight: Spotlight,
) -> ModelRequestRecord:
    """What the summarising model is asked about the turns a compaction drops. The turns
    are cut to what the prompt's budget holds: they came from a request over it."""
    room = int(settings.prompt_budget() * settings.planner_compact_at) * CHARS_PER_TOKEN
    system = summarise_prompt(spotlight)
    turns = transcript(dropped, room - len(state.goal) - len(system))
    content = f"{goal_message(state.goal)}\n\nThe turns to summarise:\n{turns}"
    return ModelRequestRecord(
        model=settings.model_for("summarising"),
        system=system,
        messages=(ModelMessage(role="user", content=content),),
        max_tokens=max(1, min(settings.llm_max_output_tokens, summary_chars // CHARS_PER_TOKEN)),
    )


def classify_request(
    state: SessionState,
    log: Sequence[Event],
    registry: Sequence[ToolSpec],
    settings: PlannerSettings,
) -> ModelRequestRecord | None:
    """What the classifying model is asked before the session's first turn: the goal's
    intent and the tools relevant to it, among more than a request can offer. None once
    asked, once the conversation has begun, or when every tool fits in a request."""
    if state.model_calls:
        return None  # Classified already, or the conversation has begun.
    budget = settings.prompt_budget()
    room = int(budget * settings.planner_tool_schema_share) - sum(
        schema_tokens(tool) for tool in control_tools(state.mode)
    )
    fits = select_tools(registry, [state.goal], (), settings.planner_max_tools, room)
    if len(fits) == len(registry):
        return None
    lines: list[str] = []
    left = int(budget * settings.planner_compact_at) * CHARS_PER_TOKEN - len(state.goal)
    for tool in registry:
        description = truncate(tool.description, CLASSIFY_DESCRIPTION_CHARS).split("\n")[0]
        line = f"- {tool.name}: {description}"
        left -= len(line) + 1
        if left < 0:
            break
        lines.append(line)
    content = f"{goal_message(state.goal)}\n\nThe tools:\n" + "\n".join(lines)
    return ModelRequestRecord(
        model=settings.model_for("classifying"),
        system=SYSTEM_CLASSIFY,
        messages=(ModelMessage(role="user", content=content),),
        max_tokens=min(settings.llm_max_output_tokens, CLASSIFY_MAX_TOKENS),
    )


class _Classification(BaseModel):
    model_config = ConfigDict(extra="ignore")
    intent: str = ""
    tools: list[str] = Field(default_factory=list)


def _classification(exchange: ModelExchangeRecorded) -> _Classification:
    """The classifying model's answer, read leniently: an answer that is not the asked-for
    JSON picks no tool (selection then goes by the words of the goal)."""
    try:
        return _Classification.model_validate(json_repair.loads(exchange.reply.content))
    except ValidationError:
        return _Classification()


def classified(log: Sequence[Event]) -> tuple[str, ...]:
    """The tools the classifying model picked for the session's goal, most relevant first."""
    event = aside(log, "classify", None)
    if event is None:
        return ()
    assert isinstance(event.data, ModelExchangeRecorded)
    return tuple(_classification(event.data).tools)


def intent_thought(exchange: ModelExchangeRecorded) -> list[Decision]:
    """What the classification says, as a thought for people watching the session."""
    answer = _classification(exchange)
    if not answer.intent and not answer.tools:
        return [_thought("observation", "the classifying model named no intent and no tool")]
    tools = ", ".join(answer.tools) or "none"
    return [_thought("observation", f"intent: {answer.intent or '?'}; tools picked: {tools}")]


def _conversation(
    state: SessionState,
    log: Sequence[Event],
    previous: list[Event],
    settings: PlannerSettings,
    spotlight: Spotlight,
) -> list[ModelMessage]:
    if not previous:
        return [ModelMessage(role="user", content=goal_message(state.goal))]
    last = previous[-1]
    assert isinstance(last.data, ModelExchangeRecorded)
    reply = last.data.reply
    messages = [
        *last.data.request.messages,
        ModelMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls),
    ]
    if not reply.tool_calls:
        note = "Call one of the tools; an answer in free text does not end the session."
        return [*messages, ModelMessage(role="user", content=note)]
    caused = [e for e in log if e.causation_id == last.id]
    for call in reply.tool_calls:
        answer = _answer(
            call, last.data, log, caused, state, settings.planner_max_result_chars, spotlight
        )
        messages.append(ModelMessage(role="tool", tool_call_id=call.id, content=answer))
    return messages


def _answer(
    call: ModelToolCall,
    exchange: ModelExchangeRecorded,
    log: Sequence[Event],
    caused: list[Event],
    state: SessionState,
    limit: int,
    spotlight: Spotlight,
) -> str:
    """What the planner tells the model about one of its calls, once acted on."""
    parsed = parse_call(call, exchange)
    if isinstance(parsed, Unusable):
        return f"Error: {parsed.reason}. Send the call again with valid arguments."
    unfinished = _finish_problem(state, parsed)
    if unfinished is not None:
        return f"Error: {unfinished}. Send the call again with valid arguments."
    if parsed.name == FINISH:
        tally = _tally(state, _Finish.model_validate(parsed.arguments))
        carry_on = "Call the next tool" if state.mode == "act" else "Call create_plan with steps"
        return f"Not finished: {tally}. {carry_on} to meet more of them, or give_up."
    plans = [e.data for e in caused if isinstance(e.data, PlanProposed)]
    if not plans:
        return "Not run: another call of the same answer was taken instead."
    plan = plans[0]
    rejection = [
        e.data.reason
        for e in log
        if isinstance(e.data, PlanRejected) and e.data.revision == plan.revision
    ]
    if rejection:
        return f"Plan revision {plan.revision} was rejected by policy: {rejection[0]}"
    if parsed.name == CREATE_PLAN:
        lines = [f"Plan revision {plan.revision}:"]
        lines += [_outcome(state, step.id, limit, spotlight) for step in plan.steps]
        if any(state.steps[s.id].status in PROBLEMS for s in plan.steps if s.id in state.steps):
            lines.append(
                "Some steps did not succeed. Call create_plan with a new plan for what remains "
                "(steps that succeeded stay done), or give_up with the reason."
            )
        else:
            lines.append(
                "Every step succeeded. Check each completion criterion against the results "
                "and call finish."
            )
        return "\n".join(lines)
    step_id = _step_id(
        exchange, exchange.reply.tool_calls.index(call), len(exchange.reply.tool_calls)
    )
    return _outcome(state, step_id, limit, spotlight)


def _outcome(state: SessionState, step_id: str, limit: int, spotlight: Spotlight | None) -> str:
    """A step's outcome in a line: for the model, what its tool wrote is delimited by the
    session's `spotlight`; None writes it plain, for people (a thought).

    Every tool's text is delimited, the built-in tools' too: they read a workspace that may
    have been filled from outside (a cloned repository, a download, a command's network
    output), and no tool result is ever a source of instructions to the planner, so
    treating a trusted one as data costs its delimiters' few tokens and nothing else."""
    step = state.steps.get(step_id)
    if step is None:
        return f"- {step_id}: unknown"
    head = f"- {step.id} ({step.tool})"

    def shown(text: str) -> str:
        return text if spotlight is None else spotlight.enclose(text)

    match step.status:
        case "succeeded":
            return f"{head}: succeeded: {shown(truncate(json.dumps(step.output), limit))}"
        case "failed" if step.error is not None:
            hint = f" Suggestion: {step.error.suggestion}" if step.error.suggestion else ""
            return f"{head}: failed ({step.error.kind}): {shown(step.error.message)}.{hint}"
        case "denied":
            return f"{head}: denied by policy: {step.reason}"
        case "skipped":
            return f"{head}: skipped: {step.reason}"
        case _:
            return f"{head}: {step.status}"


def _facts(state: SessionState, budget_chars: int, spotlight: Spotlight) -> list[str]:
    """What a compaction keeps, from the log's facts rather than a paraphrase: the goal's
    criteria, the plan in force and each step's outcome, newest kept when space runs out."""
    facts = []
    if state.completion_criteria:
        required = f" ({state.criteria_required} required)" if state.criteria_required else ""
        facts.append(f"completion criteria{required}: " + "; ".join(state.completion_criteria))
    # In the order steps were first scheduled (a replan lays its new steps out first).
    ordered = dict.fromkeys([*state.calls.values(), *state.steps])
    steps = [_outcome(state, step_id, FACT_CHARS, spotlight)[2:] for step_id in ordered]
    kept: list[str] = []
    room = budget_chars - sum(len(fact) for fact in facts)
    for fact in reversed(steps):
        room -= len(fact) + 3
        if room < 0:
            break
        kept.append(fact)
    dropped = steps[: len(steps) - len(kept)]
    if dropped:
        outcomes = Counter(fact.split(": ")[1] for fact in dropped)
        tally = ", ".join(f"{count} {status}" for status, count in sorted(outcomes.items()))
        facts.append(f"{len(dropped)} earlier steps: {tally}")
    return [*facts, *reversed(kept)]


# --- the answer ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parsed:
    """A call the planner can act on."""

    call: ModelToolCall
    name: str
    arguments: dict[str, JsonValue]
    repaired: bool
    steps: tuple[PlanStep, ...] = ()
    """The steps of a `create_plan` call, with the session's ids."""


@dataclass(frozen=True, slots=True)
class Unusable:
    """A call the planner cannot act on, and why."""

    call: ModelToolCall
    reason: str


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _DraftStep(_Lenient):
    id: str
    description: str = ""
    tool: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    risk: Literal["low", "medium", "high", "critical"] | None = None
    requires_approval: bool = False
    estimated_duration_s: float | None = Field(default=None, ge=0)


class _Draft(_Lenient):
    steps: list[_DraftStep] = Field(min_length=1)
    completion_criteria: list[str] = Field(min_length=1)
    criteria_required: int | None = Field(default=None, ge=1)
    reasoning: str = ""
    confidence: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _requires_no_more_criteria_than_declared(self) -> _Draft:
        declared = len(self.completion_criteria)
        if self.criteria_required is not None and self.criteria_required > declared:
            raise ValueError(f"criteria_required is more than the {declared} criteria declared")
        return self


class _Finish(_Lenient):
    summary: str = ""
    criteria: list[CriterionResult] = Field(min_length=1)


class _GiveUp(_Lenient):
    reason: str = Field(min_length=1)


_CONTROL_ARGUMENTS: dict[str, type[_Lenient]] = {
    CREATE_PLAN: _Draft,
    FINISH: _Finish,
    GIVE_UP: _GiveUp,
}


def parse_call(call: ModelToolCall, exchange: ModelExchangeRecorded) -> Parsed | Unusable:
    """Read a call's arguments, repairing broken JSON where the intent is unambiguous."""
    repaired = False
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError as error:
        arguments = json_repair.loads(call.arguments)
        repaired = True
        if not isinstance(arguments, dict) or not arguments:
            return Unusable(call, f"the arguments of {call.name} are not valid JSON ({error})")
    if not isinstance(arguments, dict):
        return Unusable(call, f"the arguments of {call.name} must be a JSON object")
    if call.name not in exchange.request.tools:
        return Unusable(call, f"there is no tool {call.name!r} among those offered")
    model = _CONTROL_ARGUMENTS.get(call.name)
    steps: tuple[PlanStep, ...] = ()
    try:
        if model is not None:
            model.model_validate(arguments)
        if call.name == CREATE_PLAN:
            steps = _plan_steps(exchange, _Draft.model_validate(arguments))
    except ValidationError as error:
        return Unusable(call, f"{call.name}: {_describe(error)}")
    problem = find_dependency_problem(steps)
    if problem is not None:
        return Unusable(call, f"{call.name}: {problem}")
    return Parsed(call, call.name, arguments, repaired, steps)


def _plan_steps(exchange: ModelExchangeRecorded, draft: _Draft) -> tuple[PlanStep, ...]:
    # Later plans' steps get ids of their own, so the first plan's ids (and call ids) stay unique.
    prefix = "" if exchange.purpose == "plan" else f"t{exchange.turn}."
    return tuple(
        PlanStep(
            id=prefix + step.id,
            description=step.description,
            tool=step.tool,
            arguments=step.arguments,
            depends_on=tuple(prefix + d for d in step.depends_on),
            risk=step.risk,
            requires_approval=step.requires_approval,
            estimated_duration_s=step.estimated_duration_s,
        )
        for step in draft.steps
    )


def _describe(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in detail['loc']) or 'arguments'}: {detail['msg']}"
        for detail in error.errors(include_url=False)[:3]
    )


def interpret(
    state: SessionState, log: Sequence[Event], exchange_event: Event, settings: PlannerSettings
) -> Reaction:
    """What the model's answer decides: a plan, a call, the end; or a re-ask when unusable."""
    exchange = exchange_event.data
    assert isinstance(exchange, ModelExchangeRecorded)
    reply = exchange.reply
    decisions: list[Decision] = []
    if exchange.spotlight_flagged:
        steps = ", ".join(exchange.spotlight_flagged)
        seen = (
            f"the results of {steps} held a data delimiter or the session's marker, trying "
            "to end their data early (or the marker leaked); escaped before the model read them"
        )
        decisions.append(_thought("observation", seen))
    if reply.content.strip():
        decisions.append(_thought("reasoning", reply.content))
    parsed = [parse_call(call, exchange) for call in reply.tool_calls]
    problems = [p.reason for p in parsed if isinstance(p, Unusable)]
    if not reply.tool_calls:
        problems.append("the answer called no tool")
    usable = [p for p in parsed if isinstance(p, Parsed)]
    ending = next((p for p in usable if p.name in (FINISH, GIVE_UP)), None)
    unfinished = _finish_problem(state, ending) if ending is not None else None
    if unfinished is not None:
        problems.append(unfinished)
        ending = None
    if problems and (ending is None):
        return _unusable(decisions, exchange, problems[0])
    decisions += [
        _thought("observation", f"repaired malformed JSON arguments of {p.name} from the model")
        for p in usable
        if p.repaired
    ]
    if ending is not None:
        end = _end(state, log, exchange_event, ending, settings)
        return Reaction([*decisions, *end.decisions], end.ask)
    plan = next((p for p in usable if p.name == CREATE_PLAN), None)
    if plan is not None:
        return Reaction([*decisions, *_propose(state, plan, reading(log))])
    calls = [p for p in usable if p.name not in CONTROL_TOOLS]
    loop = _loop(log, calls, settings.planner_loop_repeats)
    if loop is not None:
        return Reaction([*decisions, *loop])
    return Reaction([*decisions, *_act(state, exchange, calls, reading(log))])


def _thought(
    kind: Literal["observation", "reasoning", "decision", "reflection"], text: str
) -> Decision:
    return Decision(ThoughtRecorded(kind=kind, text=truncate(text, THOUGHT_CHARS)))


def _unusable(decisions: list[Decision], exchange: ModelExchangeRecorded, problem: str) -> Reaction:
    if exchange.purpose == "repair":
        reason = f"the model's answer could not be used, even when asked again: {problem}"
        return Reaction([*decisions, Decision(SessionFailed(reason=reason), "end")])
    note = f"the model's answer could not be used ({problem}); asking it once more"
    return Reaction([*decisions, _thought("observation", note)], "repair")


def _finish_problem(state: SessionState, call: Parsed) -> str | None:
    """Why a `finish` call cannot end the session: a declared criterion it does not report."""
    if call.name != FINISH:
        return None
    finish = _Finish.model_validate(call.arguments)
    reported = {c.criterion.strip().lower() for c in finish.criteria}
    missing = [c for c in state.completion_criteria if c.strip().lower() not in reported]
    if not missing:
        return None
    return f"finish must report every completion criterion; missing: {missing}"


@dataclass(frozen=True, slots=True)
class _Tally:
    """How the criteria a `finish` call reports stand against what the plan requires."""

    met: int
    reported: int
    required: int

    @property
    def short(self) -> bool:
        return self.met < self.required

    def __str__(self) -> str:
        return f"{self.met} of {self.reported} completion criteria met, {self.required} required"


def _tally(state: SessionState, finish: _Finish) -> _Tally:
    """Only declared criteria count once a plan declared some; otherwise all reported do."""
    declared = {c.strip().lower() for c in state.completion_criteria}
    counted = [
        c for c in finish.criteria if not declared or c.criterion.strip().lower() in declared
    ]
    required = state.criteria_required or len(declared) or len(counted)
    return _Tally(sum(1 for c in counted if c.met), len(counted), required)


def _short_finishes(state: SessionState, log: Sequence[Event], current: Event) -> int:
    """Earlier `finish` calls of the session that fell short of the required criteria."""
    short = 0
    for event in exchanges(log):
        if event.id == current.id:
            continue
        assert isinstance(event.data, ModelExchangeRecorded)
        for call in event.data.reply.tool_calls:
            parsed = parse_call(call, event.data)
            if (
                isinstance(parsed, Parsed)
                and parsed.name == FINISH
                and _finish_problem(state, parsed) is None
                and _tally(state, _Finish.model_validate(parsed.arguments)).short
            ):
                short += 1
                break
    return short


def _end(
    state: SessionState,
    log: Sequence[Event],
    exchange: Event,
    ending: Parsed,
    settings: PlannerSettings,
) -> Reaction:
    """The end a `give_up` or `finish` call brings; a `finish` short of the required criteria
    sends the model back to work, until it has fallen short too often."""
    if ending.name == GIVE_UP:
        reason = _GiveUp.model_validate(ending.arguments).reason
        return Reaction([Decision(SessionFailed(reason=f"the planner gave up: {reason}"), "end")])
    finish = _Finish.model_validate(ending.arguments)
    tally = _tally(state, finish)
    if not tally.short:
        completed = SessionCompleted(
            summary=finish.summary or str(tally),
            partial=tally.met < tally.reported,
            criteria=tuple(finish.criteria),
        )
        return Reaction([Decision(completed, "end")])
    checks = 1 + _short_finishes(state, log, exchange)
    if checks < settings.planner_max_finish_attempts:
        note = f"finish reported {tally}; the model is asked to carry on"
        return Reaction([_thought("reflection", note)], "act" if state.mode == "act" else "replan")
    stop = f"stopped after {checks} checks of the goal fell short: {tally}"
    if tally.met == 0:
        return Reaction([Decision(SessionFailed(reason=stop), "end")])
    summary = f"{stop}. {finish.summary}" if finish.summary else stop
    partly = SessionCompleted(summary=summary, partial=True, criteria=tuple(finish.criteria))
    return Reaction([Decision(partly, "end")])


def _step_id(exchange: ModelExchangeRecorded, index: int, count: int) -> str:
    return f"t{exchange.turn}" if count == 1 else f"t{exchange.turn}.{index + 1}"


def _propose(state: SessionState, plan: Parsed, read: Reading) -> list[Decision]:
    draft = _Draft.model_validate(plan.arguments)
    steps = tuple(
        step.model_copy(update={"taint": taint_of(read, step.arguments)}) for step in plan.steps
    )
    revision = state.plan_revision + 1
    proposed = PlanProposed(
        revision=revision,
        steps=steps,
        reasoning=draft.reasoning,
        confidence=draft.confidence,
        estimated_duration_s=critical_path_s(steps),
        permissions=tuple(sorted({s.tool for s in steps})),
        completion_criteria=tuple(draft.completion_criteria),
        criteria_required=draft.criteria_required,
    )
    decision = Decision(
        ThoughtRecorded(
            kind="decision" if revision == 1 else "reflection",
            text=truncate(draft.reasoning or f"plan revision {revision}", THOUGHT_CHARS),
            confidence=draft.confidence,
        )
    )
    return [*_supersede(state, revision), decision, Decision(proposed, f"plan/{revision}")]


def _supersede(state: SessionState, revision: int) -> list[Decision]:
    """Steps of earlier plans that never ran will not run: the new plan replaces them."""
    return [
        Decision(
            StepSkipped(step_id=s.id, reason=f"replaced by plan revision {revision}"),
            f"skip/{s.id}",
        )
        for s in state.steps.values()
        if s.status == "pending"
    ]


def _act(
    state: SessionState, exchange: ModelExchangeRecorded, calls: list[Parsed], read: Reading
) -> list[Decision]:
    count = len(exchange.reply.tool_calls)
    steps = tuple(
        PlanStep(
            id=_step_id(exchange, exchange.reply.tool_calls.index(p.call), count),
            tool=p.name,
            arguments=p.arguments,
            taint=taint_of(read, p.arguments),
        )
        for p in calls
    )
    revision = state.plan_revision + 1
    proposed = PlanProposed(
        revision=revision,
        steps=steps,
        reasoning=exchange.reply.content,
        permissions=tuple(sorted({s.tool for s in steps})),
    )
    action = "; ".join(_signature(s.tool, s.arguments) for s in steps)
    return [
        *_supersede(state, revision),
        Decision(ThoughtRecorded(kind="action", text=truncate(action, THOUGHT_CHARS))),
        Decision(proposed, f"plan/{revision}"),
    ]


def _signature(tool: str, arguments: dict[str, JsonValue]) -> str:
    return f"{tool} {json.dumps(arguments, sort_keys=True)}"


def _loop(log: Sequence[Event], calls: list[Parsed], repeats: int) -> list[Decision] | None:
    """Stop when the new calls make the same call, or the same cycle of calls, `repeats`
    times in a row."""
    history = [
        _signature(e.data.tool, e.data.arguments)
        for e in log
        if isinstance(e.data, StepScheduled) and e.data.attempt == 1
    ]
    history += [_signature(p.name, p.arguments) for p in calls]
    for length in (1, 2, 3):
        span = length * repeats
        if len(history) < span:
            break
        cycle = history[-length:]
        if all(history[-span + i] == cycle[i % length] for i in range(span)):
            shown = " → ".join(cycle)
            reason = (
                f"stopped: the model repeated {shown} {repeats} times in a row; "
                "a person should look at the goal or the tools"
            )
            return [
                Decision(LoopDetected(calls=tuple(cycle), repeats=repeats), "loop"),
                Decision(SessionFailed(reason=reason), "end"),
            ]
    return None
