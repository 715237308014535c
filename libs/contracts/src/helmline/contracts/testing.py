"""Hypothesis strategies for events, for property tests of code that folds or maps them.

Other teams can use them too (install `helmline-contracts[testing]`). Payloads are derived
from the models themselves, so a new event type is covered as soon as it is in the
catalogue. Identifiers of steps, calls, requests, checkpoints and rollbacks are drawn from
a few values, so that the events of a drawn session meet the same records, as a session's
events do.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import annotated_types
from hypothesis import strategies as st
from pydantic import BaseModel, JsonValue
from pydantic.fields import FieldInfo

from helmline.contracts import (
    PAYLOAD_CLASSES,
    ArgumentCondition,
    Event,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    Playbook,
    StepAuthorization,
    StepId,
    new_event,
)

STEP_IDS = ("s0", "s1", "s2", "s3")
"""The steps a drawn event may name."""
RECORD_IDS: dict[str, tuple[str, ...]] = {
    "call_id": ("c0", "c1", "c2"),
    "request_id": ("r0", "r1"),
    "checkpoint_id": ("cp0", "cp1"),
    "rollback_id": ("rb0",),
    "compensation_id": ("u0",),
}
"""By field name, the records a drawn event may name."""
_STEP_ID_PATTERN = typing.get_args(StepId)[1].pattern

times = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
)
"""Event times over some years."""

_json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12)
_json: st.SearchStrategy[Any] = st.recursive(
    _json_leaf | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
# A condition must say something and its regex compile, which no annotation tells.
_argument_conditions = st.builds(
    ArgumentCondition,
    glob=st.none() | st.just(("src/**", "*.md")),
    regex=st.just("^ls\\b"),
    min=st.none() | st.just(1.0),
    max=st.none() | st.just(10.0),
)


def _for_annotation(annotation: Any, metadata: list[Any], name: str) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _for_annotation(args[0], [*metadata, *args[1:]], name)
    if annotation is JsonValue or annotation == JsonValue or annotation is Any:
        return _json
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_for_annotation(arg, metadata, name) for arg in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if annotation is type(None):
        return st.none()
    if origin is tuple:
        low = next((m.min_length for m in metadata if isinstance(m, annotated_types.MinLen)), 0)
        items = _for_annotation(args[0], [], name)
        return st.lists(items, min_size=low, max_size=low + 3).map(tuple)
    if origin is dict:
        key = _for_annotation(args[0], [], name)
        return st.dictionaries(key, _for_annotation(args[1], [], name), max_size=3)
    if annotation is Playbook:
        return _playbooks()
    if annotation is ArgumentCondition:
        return _argument_conditions
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _for_model(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        int_low, int_high = _bounds(metadata, step=1)
        return st.integers(min_value=int(int_low), max_value=int(int_high))
    if annotation is float:
        float_low, float_high = _bounds(metadata, step=0.001)
        return st.floats(min_value=float_low, max_value=float_high, allow_nan=False)
    if annotation is str:
        return _strings(metadata, name)
    if annotation is datetime:
        return times
    raise NotImplementedError(f"no strategy for {annotation!r}")


def _strings(metadata: list[Any], name: str) -> st.SearchStrategy[str]:
    pattern = next((p for m in metadata if (p := getattr(m, "pattern", None))), None)
    if pattern == _STEP_ID_PATTERN:
        return st.sampled_from(STEP_IDS)
    if name in RECORD_IDS:
        return st.sampled_from(RECORD_IDS[name])
    if pattern:
        longest = next((n for m in metadata if (n := getattr(m, "max_length", None))), None)
        matching = st.from_regex(pattern, fullmatch=True)
        # A pattern says nothing of length (a host name's 253 characters, say).
        return matching if longest is None else matching.filter(lambda s: len(s) <= longest)
    low = next((m.min_length for m in metadata if isinstance(m, annotated_types.MinLen)), 0)
    return st.text(min_size=low, max_size=max(low, 16))


def _bounds(metadata: list[Any], step: float) -> tuple[float, float]:
    low: float = -1000.0
    high: float = 1e6
    for constraint in metadata:
        if isinstance(constraint, annotated_types.Ge):
            low = float(constraint.ge)  # type: ignore[arg-type]
        elif isinstance(constraint, annotated_types.Gt):
            low = float(constraint.gt) + step  # type: ignore[arg-type]
        elif isinstance(constraint, annotated_types.Le):
            high = float(constraint.le)  # type: ignore[arg-type]
    return low, high


def _for_field(name: str, info: FieldInfo) -> st.SearchStrategy[Any]:
    return _for_annotation(info.annotation, list(info.metadata), name)


def _fields_of(model: type[BaseModel], *, but: str) -> dict[str, st.SearchStrategy[Any]]:
    """Strategies for every field of `model` except `but`, which its caller draws."""
    return {
        name: _for_field(name, info) for name, info in model.model_fields.items() if name != but
    }


def _for_model(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    fields = {name: _for_field(name, info) for name, info in model.model_fields.items()}
    return st.fixed_dictionaries(fields).map(lambda values: model.model_validate(values))


@st.composite
def _playbooks(draw: st.DrawFn) -> Playbook:
    # A playbook must be a DAG: each step may only depend on steps declared before it.
    drawn: list[PlanStep] = draw(
        st.lists(_for_model(PlanStep), min_size=1, max_size=4, unique_by=lambda step: step.id)
    )
    steps = []
    for index, step in enumerate(drawn):
        earlier = [s.id for s in drawn[:index]]
        depends_on = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
        steps.append(step.model_copy(update={"depends_on": tuple(depends_on)}))
    return Playbook(goal=draw(st.text(min_size=1, max_size=10)), steps=tuple(steps))


@st.composite
def _plans(draw: st.DrawFn) -> PlanProposed:
    # A plan requires at most as many criteria as it declares, which no annotation tells.
    values = draw(st.fixed_dictionaries(_fields_of(PlanProposed, but="criteria_required")))
    declared = len(values["completion_criteria"])
    required = draw(st.none() | st.integers(1, declared)) if declared else None
    return PlanProposed.model_validate({**values, "criteria_required": required})


@st.composite
def _plan_approvals(draw: st.DrawFn) -> PlanApproved:
    # A plan authorises each step once, which no annotation tells.
    values = draw(st.fixed_dictionaries(_fields_of(PlanApproved, but="authorized_steps")))
    authorized = draw(
        st.lists(_for_model(StepAuthorization), max_size=3, unique_by=lambda a: a.step_id)
    )
    return PlanApproved.model_validate({**values, "authorized_steps": tuple(authorized)})


_STRATEGIES: dict[type[Payload], Callable[[], st.SearchStrategy[Any]]] = {
    PlanProposed: _plans,
    PlanApproved: _plan_approvals,
}
"""Payloads with rules across fields, drawn by their own strategies."""

payloads: st.SearchStrategy[Payload] = st.one_of(
    *(_STRATEGIES[c]() if c in _STRATEGIES else _for_model(c) for c in PAYLOAD_CLASSES)
)
"""A payload of any event type of the catalogue."""


@st.composite
def sessions(draw: st.DrawFn, max_events: int = 25) -> list[Event]:
    """The events of one session, of any types in any order (the first is the root)."""
    drawn: list[Payload] = draw(st.lists(payloads, min_size=1, max_size=max_events))
    root = new_event(
        drawn[0], tenant="acme", session_id="s1", source="helmline/test", at=draw(times)
    )
    events = [root]
    for index, payload in enumerate(drawn[1:]):
        events.append(root.derive(payload, source="helmline/test", key=str(index), at=draw(times)))
    return events
