"""Plans and playbooks: what a session intends to do, step by step."""

from __future__ import annotations

from graphlib import CycleError, TopologicalSorter
from typing import Literal

from pydantic import Field, model_validator

from helmline.contracts._taint import CallTaint
from helmline.contracts._values import Arguments, Contract, Host, Risk, StepId, ToolName


class PlanStep(Contract):
    """One step of a plan: a single tool call with its dependencies."""

    id: StepId
    """Unique within the plan; other steps name it in `depends_on`."""
    description: str = ""
    """What the step is for, in plain words."""
    tool: ToolName
    """The tool to call."""
    arguments: Arguments = Field(default_factory=dict)
    """The tool's arguments."""
    depends_on: tuple[StepId, ...] = ()
    """Steps that must complete before this one may start."""
    risk: Risk | None = None
    """Risk declared by the plan; when absent the tool's default risk applies."""
    requires_approval: bool = False
    """Whether the plan itself asks for a person to approve this step."""
    estimated_duration_s: float | None = Field(default=None, ge=0)
    """Expected duration, shown up front."""
    on_denied: Literal["fail", "continue"] | None = None
    """What happens when policy or a person denies this step; defaults to the plan's."""
    hosts: tuple[Host, ...] = ()
    """Network hosts the step's call needs to reach (`api.example.com`): the policy rule that
    decides the call must grant them (`hosts:`), or a person grants them on request; a call
    granted hosts runs with a network."""
    taint: CallTaint | None = None
    """What untrusted content the model had read when it proposed the step (the planner
    says; a playbook's steps have none): policy rules match it. None when no untrusted
    result was in the model's context."""


def find_dependency_problem(steps: tuple[PlanStep, ...]) -> str | None:
    """Say what is wrong with the steps' ids and dependencies, or None when they form a DAG."""
    ids = [step.id for step in steps]
    seen: set[str] = set()
    for step_id in ids:
        if step_id in seen:
            return f"step id {step_id!r} is used twice"
        seen.add(step_id)
    for step in steps:
        for dependency in step.depends_on:
            if dependency not in seen:
                return f"step {step.id!r} depends on unknown step {dependency!r}"
    # graphlib sorts in linear time: plans of thousands of steps are checked at every decode.
    depends_on = {step.id: step.depends_on for step in steps}
    try:
        TopologicalSorter(depends_on).prepare()
    except CycleError as error:
        cycle: list[str] = error.args[1][:-1]
        if cycle[1 % len(cycle)] not in depends_on[cycle[0]]:
            cycle.reverse()  # Read it as "a depends on b, which depends on ...".
        start = cycle.index(min(cycle))  # The same cycle always reads the same way.
        path = " -> ".join([*cycle[start:], *cycle[:start], cycle[start]])
        return f"dependency cycle among steps: {path}"
    return None


def critical_path_s(steps: tuple[PlanStep, ...]) -> float | None:
    """How long the steps take at the least, independent ones running side by side: the
    longest chain of estimates through their dependencies. None unless every step has an
    estimate, since a guess for the others would be shown as if it were known.

    The steps must form a DAG (see `find_dependency_problem`); a dependency on a step outside
    them (one an earlier plan completed) adds nothing.
    """
    if any(step.estimated_duration_s is None for step in steps):
        return None
    by_id = {step.id: step for step in steps}
    finish: dict[str, float] = {}
    for step_id in TopologicalSorter({s.id: s.depends_on for s in steps}).static_order():
        step = by_id.get(step_id)
        if step is not None:
            ready = max((finish.get(d, 0.0) for d in step.depends_on), default=0.0)
            finish[step_id] = ready + (step.estimated_duration_s or 0.0)
    return max(finish.values(), default=0.0)


class Playbook(Contract):
    """A declared plan: a goal and its steps, run without a model."""

    goal: str = Field(min_length=1)
    """What the playbook achieves."""
    steps: tuple[PlanStep, ...] = Field(min_length=1)
    """The steps; independent ones may run in parallel."""
    on_denied: Literal["fail", "continue"] = "fail"
    """Default for steps that are denied: fail the session, or skip the step and its dependants."""

    @model_validator(mode="after")
    def _steps_form_a_dag(self) -> Playbook:
        problem = find_dependency_problem(self.steps)
        if problem is not None:
            raise ValueError(problem)
        return self
