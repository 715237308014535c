"""What the planner tells a model: the system prompts and the tools that steer a session.

The control tools (`create_plan`, `finish`, `give_up`) are how a model plans, declares the
goal met and stops; an answer in free text never ends a session.
"""

from __future__ import annotations

from typing import Any

from helmline.contracts import ToolSpec
from helmline.planner._spotlight import Spotlight

CREATE_PLAN = "create_plan"
FINISH = "finish"
GIVE_UP = "give_up"

SYSTEM_PLAN = (
    "You are the planner of Helmline, which runs tools for a goal under policy, in a sandbox. "
    "Plan the whole goal at once: call create_plan with the steps (each step is one call of "
    "one tool with its arguments; depends_on lists the steps that must succeed first), the "
    "completion criteria that will show the goal is met (and, if not all of them must be, how "
    "many: criteria_required), your reasoning and your confidence. "
    "The steps then run under policy and you see every result. If a step fails or is "
    "denied, call create_plan again with a new plan for what remains (choose another way), "
    "or call give_up with a clear reason. When every step has succeeded, check each "
    "completion criterion against the results and call finish, reporting each criterion as "
    "met or not with its evidence; the session ends when enough of them are met. Never answer "
    "with free text alone."
)
SYSTEM_CLASSIFY = (
    "You classify a goal given to an agent that acts with tools. Say in a few words what "
    "the goal asks for, and name the listed tools that could help reach it, the most "
    'relevant first. Answer with one JSON object and nothing else: {"intent": "...", '
    '"tools": ["tool name", ...]}.'
)

SYSTEM_SUMMARISE = (
    "You summarise the earlier turns of an agent's work on a goal, for the agent itself to "
    "carry on from: what was tried, what was learnt, what is left to do. Keep names, paths, "
    "numbers and error messages exact; add nothing that the turns do not say. Answer with "
    "the summary alone, in short plain sentences."
)

SYSTEM_ACT = (
    "You are the planner of Helmline, which runs tools for a goal under policy, in a sandbox. "
    "Work one step at a time: call the one tool that brings the goal closer, then read its "
    "result and decide the next call. If a call fails or is denied, choose another way, or "
    "call give_up with a clear reason. When the goal is met, call finish, reporting each "
    "completion criterion you checked as met or not with its evidence. Never answer with "
    "free text alone."
)


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_STEP = _object(
    {
        "id": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$"},
        "description": {"type": "string"},
        "tool": {"type": "string"},
        "arguments": {"type": "object"},
        "depends_on": {"type": "array", "items": {"type": "string"}},
        "risk": {"enum": ["low", "medium", "high", "critical"]},
        "requires_approval": {"type": "boolean"},
        "estimated_duration_s": {"type": "number", "minimum": 0},
    },
    ["id", "tool", "arguments"],
)

_CRITERION = _object(
    {
        "criterion": {"type": "string"},
        "met": {"type": "boolean"},
        "evidence": {"type": "string"},
    },
    ["criterion", "met"],
)

CONTROL_TOOLS: dict[str, ToolSpec] = {
    CREATE_PLAN: ToolSpec(
        name=CREATE_PLAN,
        description="Propose the plan for the goal (or a new plan for what remains).",
        parameters=_object(
            {
                "steps": {"type": "array", "items": _STEP, "minItems": 1},
                "completion_criteria": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                },
                "criteria_required": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "How many of the criteria must be met; all when omitted.",
                },
                "reasoning": {"type": "string"},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            ["steps", "completion_criteria", "reasoning"],
        ),
        risk="low",
        executor="gateway",
    ),
    FINISH: ToolSpec(
        name=FINISH,
        description="Declare the goal met (or met in part), reporting every completion "
        "criterion with its evidence.",
        parameters=_object(
            {
                "summary": {"type": "string"},
                "criteria": {"type": "array", "items": _CRITERION, "minItems": 1},
            },
            ["summary", "criteria"],
        ),
        risk="low",
        executor="gateway",
    ),
    GIVE_UP: ToolSpec(
        name=GIVE_UP,
        description="Stop: the goal cannot be reached. Say why.",
        parameters=_object({"reason": {"type": "string"}}, ["reason"]),
        risk="low",
        executor="gateway",
    ),
}


def control_tools(mode: str) -> list[ToolSpec]:
    """The control tools a session of that mode is offered."""
    names = [FINISH, GIVE_UP] if mode == "act" else [CREATE_PLAN, FINISH, GIVE_UP]
    return [CONTROL_TOOLS[name] for name in names]


def system_prompt(mode: str, override: str | None, spotlight: Spotlight) -> str:
    """The system prompt of a session's turns: the configured one, else the mode's own,
    then spotlighting's standing instruction (a configured prompt gets it too: it is a
    defence, not a matter of style)."""
    base = override or (SYSTEM_ACT if mode == "act" else SYSTEM_PLAN)
    return f"{base}\n\n{spotlight.instruction()}"


def summarise_prompt(spotlight: Spotlight) -> str:
    """The summarising model's system prompt: the turns it reads hold tool results too."""
    return f"{SYSTEM_SUMMARISE}\n\n{spotlight.instruction()}"


def goal_message(goal: str) -> str:
    """The first user message of a session."""
    return f"Goal: {goal}"
