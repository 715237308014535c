"""A session's plan as a graph, cut to what a view can draw.

Steps are laid out in layers: a step's layer is the longest chain of dependencies before it,
so the steps of one layer wait for nothing in it and may run in parallel. A plan of thousands
of steps is answered as a window of layers around one step (the current one by default),
at most so many steps drawn a layer, and counts by status for the layers outside the window
and the steps left out of it, so a view never draws (or receives) the whole plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from helmline.api._auth import Viewer
from helmline.api._problems import PROBLEM_RESPONSES, FieldProblem, invalid
from helmline.api._routes import NOT_FOUND, SessionPath
from helmline.api._session_parts import AtSeq, snapshot_at
from helmline.contracts import IN_FLIGHT_STEPS, SessionState, StepState, StepStatus

router = APIRouter(tags=["sessions"], responses={**PROBLEM_RESPONSES, **NOT_FOUND})


class GraphNode(BaseModel):
    """A step drawn in the graph."""

    id: str
    tool: str
    status: StepStatus
    layer: int
    position: int
    """Its index in plan order."""
    depends_on: list[str]
    """The steps it waits for that are drawn too."""
    hidden_depends_on: int
    """How many steps it waits for are not drawn (outside the window, or left out)."""


class GraphLayer(BaseModel):
    """One layer of the window: steps that may run in parallel once the layers above ran."""

    layer: int
    steps: int
    """Steps in the layer, drawn or not."""
    by_status: dict[str, int]
    """How many of them are in each status."""
    shown: int
    """How many of them are drawn."""


class PlanGraph(BaseModel):
    """A window of the plan's layers, the steps drawn in it, and counts for the rest."""

    steps_total: int
    layers_total: int
    current: str | None
    """The step the session is at: the first under way, else the first still to run, else
    the last that ran; None when the plan has no step."""
    focus: str | None
    """The step the window is centred on (the current one unless another was asked)."""
    first_layer: int
    """The first layer of the window."""
    layers: list[GraphLayer]
    nodes: list[GraphNode]
    """The steps drawn, in plan order."""
    before: dict[str, int]
    """Steps in the layers above the window, by status."""
    after: dict[str, int]
    """Steps in the layers below the window, by status."""


def layers_of(steps: Iterable[StepState]) -> dict[str, int]:
    """Each step's layer: 0 for a step waiting for none, else one more than its deepest
    dependency's. Dependencies on steps not in the plan are ignored."""
    chosen = {step.id: step for step in steps}
    layer: dict[str, int] = {}
    later: list[str] = []
    # Plans name their dependencies before the steps that wait for them, nearly always:
    # one pass in plan order places those.
    for step in chosen.values():
        deepest = -1
        for d in step.depends_on:
            if d in layer:
                deepest = max(deepest, layer[d])
            elif d in chosen:
                break
        else:
            layer[step.id] = deepest + 1
            continue
        later.append(step.id)
    for start in later:
        # Depth-first without recursion: a plan may be a chain of 10,000 steps.
        stack = [(start, False)]
        while stack:
            step_id, expanded = stack.pop()
            if step_id in layer:
                continue
            known = [d for d in chosen[step_id].depends_on if d in chosen]
            if expanded:
                layer[step_id] = 1 + max((layer.get(d, 0) for d in known), default=-1)
                continue
            stack.append((step_id, True))
            # A validated plan has no cycle; a dependency met again before its layer is
            # known counts as layer 0 rather than loop.
            stack.extend((d, False) for d in known if d not in layer)
    return layer


def current_step(state: SessionState) -> str | None:
    first_pending = last_ran = None
    for step in state.steps.values():
        if step.status in IN_FLIGHT_STEPS or step.retry_at is not None:
            return step.id
        if step.status == "pending":
            first_pending = first_pending or step.id
        else:
            last_ran = step.id
    return first_pending or last_ran


def _shown(members: list[StepState], focus: str | None, per_layer: int) -> list[StepState]:
    """A layer's steps to draw: the focus first, then those not succeeded, in plan order."""
    if len(members) <= per_layer:
        return members
    rank = {step.id: index for index, step in enumerate(members)}
    ordered = sorted(members, key=lambda s: (s.id != focus, s.status == "succeeded", rank[s.id]))
    return sorted(ordered[:per_layer], key=lambda s: rank[s.id])


def plan_graph(
    state: SessionState,
    focus: str | None,
    window: int,
    per_layer: int,
    on_layer: int | None = None,
) -> PlanGraph:
    """The window around `focus`, else the first step of layer `on_layer`, else the current
    step."""
    steps = list(state.steps.values())
    layer = layers_of(steps)
    layers_total = 1 + max(layer.values(), default=-1)
    if on_layer is not None and on_layer >= layers_total:
        message = f"the plan has {layers_total} layers (0 to {layers_total - 1})"
        raise invalid([FieldProblem(field="query.layer", message=message)])
    current = current_step(state)
    if focus is None and on_layer is not None:
        focus = next(step.id for step in steps if layer[step.id] == on_layer)
    focus = focus or current
    centre = layer.get(focus, 0) if focus else 0
    first = max(0, min(centre - window // 2, layers_total - window))
    last = min(layers_total, first + window)
    members: dict[int, list[StepState]] = {n: [] for n in range(first, last)}
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    for step in steps:
        at = layer[step.id]
        if at < first:
            before[step.status] += 1
        elif at >= last:
            after[step.status] += 1
        else:
            members[at].append(step)
    drawn = {n: _shown(in_layer, focus, per_layer) for n, in_layer in members.items()}
    shown_ids = {step.id for chosen in drawn.values() for step in chosen}
    position = {step.id: index for index, step in enumerate(steps)}
    nodes = sorted(
        (
            GraphNode(
                id=step.id,
                tool=step.tool,
                status=step.status,
                layer=layer[step.id],
                position=position[step.id],
                depends_on=[d for d in step.depends_on if d in shown_ids],
                hidden_depends_on=sum(
                    1 for d in step.depends_on if d in state.steps and d not in shown_ids
                ),
            )
            for chosen in drawn.values()
            for step in chosen
        ),
        key=lambda node: node.position,
    )
    return PlanGraph(
        steps_total=len(steps),
        layers_total=layers_total,
        current=current,
        focus=focus,
        first_layer=first,
        layers=[
            GraphLayer(
                layer=n,
                steps=len(in_layer),
                by_status=dict(Counter(step.status for step in in_layer)),
                shown=len(drawn[n]),
            )
            for n, in_layer in members.items()
        ],
        nodes=nodes,
        before=dict(before),
        after=dict(after),
    )


@router.get("/sessions/{session_id}/graph")
async def session_graph(
    session_id: SessionPath,
    principal: Viewer,
    request: Request,
    focus: Annotated[
        str | None,
        Query(max_length=128, description="The step to centre on (the current one if not given)"),
    ] = None,
    layers: Annotated[int, Query(ge=1, le=50, description="How many layers to draw")] = 7,
    per_layer: Annotated[
        int, Query(ge=1, le=100, description="How many steps of a layer to draw at most")
    ] = 12,
    layer: Annotated[
        int | None,
        Query(ge=0, le=1_000_000, description="Centre on this layer's first step instead"),
    ] = None,
    at_seq: AtSeq = None,
) -> PlanGraph:
    """The plan as layers of steps that may run in parallel, with their dependencies: a
    window of `layers` layers around `focus`, and counts by status for the rest; as the plan
    was after `at_seq` when given."""
    state = (await snapshot_at(request, principal.tenant, session_id, at_seq)).state
    if focus is not None and focus not in state.steps:
        problem = FieldProblem(field="query.focus", message=f"the plan has no step {focus}")
        raise invalid([problem])
    return plan_graph(state, focus, layers, per_layer, layer)
