"""Properties of the event catalogue and the fold, over random valid event sequences."""

from __future__ import annotations

import types
import typing
from datetime import UTC, datetime
from typing import Any

import annotated_types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, JsonValue
from pydantic.fields import FieldInfo

from helmline.contracts import (
    PAYLOAD_CLASSES,
    Actor,
    ArgumentCondition,
    CheckpointCreated,
    Event,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    Playbook,
    SessionCompleted,
    SessionFold,
    SessionStarted,
    StepScheduled,
    ThoughtRecorded,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallStarted,
    decode_event,
    encode_event,
    evolve,
    fold,
    new_event,
)

# --- strategies derived from the models themselves, so new event types are covered ---

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
_times = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
)


def _for_annotation(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _for_annotation(args[0], [*metadata, *args[1:]])
    if annotation is JsonValue or annotation == JsonValue or annotation is Any:
        return _json
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_for_annotation(arg, metadata) for arg in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if annotation is type(None):
        return st.none()
    if origin is tuple:
        low = next((m.min_length for m in metadata if isinstance(m, annotated_types.MinLen)), 0)
        return st.lists(_for_annotation(args[0], []), min_size=low, max_size=low + 3).map(tuple)
    if origin is dict:
        key = _for_annotation(args[0], [])
        return st.dictionaries(key, _for_annotation(args[1], []), max_size=3)
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
        pattern = next(
            (getattr(m, "pattern", None) for m in metadata if getattr(m, "pattern", None)), None
        )
        if pattern:
            return st.from_regex(pattern, fullmatch=True)
        low = next((m.min_length for m in metadata if isinstance(m, annotated_types.MinLen)), 0)
        return st.text(min_size=low, max_size=max(low, 16))
    if annotation is datetime:
        return _times
    raise NotImplementedError(f"no strategy for {annotation!r}")


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


def _for_field(info: FieldInfo) -> st.SearchStrategy[Any]:
    return _for_annotation(info.annotation, list(info.metadata))


def _for_model(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    fields = {name: _for_field(info) for name, info in model.model_fields.items()}
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
    fields = {
        name: _for_field(info)
        for name, info in PlanProposed.model_fields.items()
        if name != "criteria_required"
    }
    values = draw(st.fixed_dictionaries(fields))
    declared = len(values["completion_criteria"])
    required = draw(st.none() | st.integers(1, declared)) if declared else None
    return PlanProposed.model_validate({**values, "criteria_required": required})


_payloads: st.SearchStrategy[Payload] = st.one_of(
    *(_plans() if c is PlanProposed else _for_model(c) for c in PAYLOAD_CLASSES)
)


@st.composite
def _sessions(draw: st.DrawFn) -> list[Event]:
    payloads: list[Payload] = draw(st.lists(_payloads, min_size=1, max_size=25))
    root = new_event(
        payloads[0], tenant="acme", session_id="s1", source="helmline/test", at=draw(_times)
    )
    events = [root]
    for index, payload in enumerate(payloads[1:]):
        events.append(root.derive(payload, source="helmline/test", key=str(index), at=draw(_times)))
    return events


# --- properties ---


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_sessions())
def test_every_event_round_trips_exactly(events: list[Event]) -> None:
    for event in events:
        wire = encode_event(event)
        decoded = decode_event(wire)
        assert decoded == event
        assert encode_event(decoded) == wire


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_sessions(), data=st.data())
def test_folding_a_prefix_then_the_rest_equals_folding_everything(
    events: list[Event], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    whole = fold(events)
    prefix = fold(events[:cut])
    continued = fold(events[cut:], prefix)
    assert continued == whole
    # Continuing from a state must never change that state.
    assert prefix == fold(events[:cut])
    assert whole.event_count == len(events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_sessions())
def test_evolving_one_event_at_a_time_equals_folding(events: list[Event]) -> None:
    state = fold([])
    for event in events:
        state = evolve(state, event)
    assert state == fold(events)
    assert fold(events) == fold(events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_sessions())
def test_states_taken_during_a_fold_never_change_afterwards(events: list[Event]) -> None:
    folding = SessionFold()
    taken = []
    for event in events:
        folding.apply(event)
        taken.append(folding.state())
    for index, state in enumerate(taken):
        assert state == fold(events[: index + 1])


def _three_steps_run() -> list[Event]:
    """Three steps run one after another, each step's record updated four times, with a
    thought and a checkpoint for each."""
    plan = tuple(PlanStep(id=f"s{i}", tool="echo") for i in range(3))
    started = new_event(
        SessionStarted(goal="three", requested_by=Actor(id="ana")),
        tenant="acme",
        session_id="s1",
        source="helmline/test",
    )
    payloads: list[Payload] = [
        PlanProposed(revision=1, steps=plan),
        PlanApproved(revision=1, approved_by=Actor(id="ana")),
    ]
    for i, step in enumerate(plan):
        call = {"step_id": step.id, "call_id": f"c{i}", "tool": "echo"}
        payloads += [
            StepScheduled(**call),
            ThoughtRecorded(kind="action", text=f"running {step.id}", step_id=step.id),
            ToolCallAuthorized(**call, arguments={"message": str(i)}, risk="low"),
            ToolCallStarted(**call),
            ToolCallCompleted(**call, output={"message": str(i)}),
            CheckpointCreated(
                checkpoint_id=f"cp{i}", step_id=step.id, call_id=f"c{i}", at_seq=8 + 6 * i
            ),
        ]
    payloads.append(SessionCompleted(summary="done"))
    return [started] + [
        started.derive(payload, source="helmline/test", key=str(index))
        for index, payload in enumerate(payloads)
    ]


def test_a_state_taken_between_updates_of_one_step_never_changes_afterwards() -> None:
    # A fold changes the records it made in place until it hands out a state, and appends
    # checkpoints and thoughts to lists it joins then: a state taken at any event must keep
    # what it showed while the fold goes on.
    events = _three_steps_run()
    for cut in range(len(events)):
        folding = SessionFold()
        for event in events[: cut + 1]:
            folding.apply(event)
        taken = folding.state()
        shown = {step_id: repr(step) for step_id, step in taken.steps.items()}
        for event in events[cut + 1 :]:
            folding.apply(event)
        assert {step_id: repr(step) for step_id, step in taken.steps.items()} == shown
        assert taken == fold(events[: cut + 1]), f"after event {cut}"
        assert folding.state() == fold(events)
    assert [c.checkpoint_id for c in fold(events).checkpoints] == ["cp0", "cp1", "cp2"]
    assert len(fold(events).thoughts) == 3
