"""Properties of the event catalogue and the fold, over random valid event sequences."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from helmline.contracts import (
    EXAMPLE_PAYLOADS,
    PAYLOAD_CLASSES,
    Actor,
    CheckpointCreated,
    Event,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    SessionCompleted,
    SessionFold,
    SessionStarted,
    SessionState,
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
from helmline.contracts.testing import sessions

# --- properties ---


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=sessions())
def test_every_event_round_trips_exactly(events: list[Event]) -> None:
    for event in events:
        wire = encode_event(event)
        decoded = decode_event(wire)
        assert decoded == event
        assert encode_event(decoded) == wire


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=sessions(), data=st.data())
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
@given(events=sessions())
def test_evolving_one_event_at_a_time_equals_folding(events: list[Event]) -> None:
    state = fold([])
    for event in events:
        state = evolve(state, event)
    assert state == fold(events)
    assert fold(events) == fold(events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=sessions())
def test_states_taken_during_a_fold_never_change_afterwards(events: list[Event]) -> None:
    folding = SessionFold()
    taken = []
    for event in events:
        folding.apply(event)
        taken.append(folding.state())
    for index, state in enumerate(taken):
        assert state == fold(events[: index + 1])


STATES = TypeAdapter(SessionState)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=sessions(), data=st.data())
def test_folding_on_from_a_state_changes_neither_it_nor_another_branch(
    events: list[Event], data: st.DataObject
) -> None:
    # A state shares its tables with every state folded on from it: a write that reached a
    # shared part would show in the state before, or in a branch folded from it as well.
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    before = fold(events[:cut])
    states, shown = [before], [STATES.dump_json(before)]
    for event in events[cut:]:
        states.append(evolve(states[-1], event))
        shown.append(STATES.dump_json(states[-1]))
    fold(reversed(events[cut:]), before)
    for state in states[:-1]:
        fold(events[cut:], state)
    assert [STATES.dump_json(state) for state in states] == shown
    assert states[-1] == fold(events)


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


def test_the_fold_has_a_reducer_for_every_event_type() -> None:
    # Each payload class of the catalogue has its example: a class without a reducer fails
    # here (the fold looks reducers up by the payload's exact class).
    assert [type(example) for example in EXAMPLE_PAYLOADS] == list(PAYLOAD_CLASSES)
    for example in EXAMPLE_PAYLOADS:
        event = new_event(example, tenant="t", session_id="s", source="test")
        assert fold([event]).event_count == 1, example.TYPE
