"""Decoding refuses bad input with a clear reason; upcasting brings old versions forward."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helmline.contracts import (
    Actor,
    PlanProposed,
    PlanStep,
    Playbook,
    SessionStarted,
    UndecodableEvent,
    UnknownEventType,
    UnknownSchemaVersion,
    UpcasterRegistry,
    critical_path_s,
    decode_event,
    encode_event,
    event_subject,
    new_event,
    parse_event_subject,
)


def _started() -> bytes:
    payload = SessionStarted(goal="tidy the workspace", requested_by=Actor(id="ana"))
    return encode_event(new_event(payload, tenant="acme", session_id="s1", source="test"))


def test_the_wire_form_is_cloudevents_structured_json() -> None:
    document = json.loads(_started())
    assert document["specversion"] == "1.0"
    assert document["type"] == "session.started"
    assert document["sessionid"] == "s1"
    assert document["schemaversion"] == 1
    assert document["correlationid"] == document["id"]
    assert "type" not in document["data"]


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        (b"{not json", UndecodableEvent, "not valid JSON"),
        (b"[1, 2]", UndecodableEvent, "must be a JSON object"),
        (b'{"type": "session.exploded"}', UnknownEventType, "unknown event type"),
        (b'{"data": {}}', UnknownEventType, "no string `type`"),
    ],
)
def test_undecodable_input_says_why(raw: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        decode_event(raw)


def test_a_field_of_the_wrong_type_is_named() -> None:
    document = json.loads(_started())
    document["data"]["goal"] = 42
    with pytest.raises(UndecodableEvent, match=r"data\.goal"):
        decode_event(json.dumps(document))


def test_a_newer_schema_version_is_refused() -> None:
    document = json.loads(_started())
    document["schemaversion"] = 9
    with pytest.raises(UnknownSchemaVersion, match="newer than this build"):
        decode_event(json.dumps(document))


def test_upcasters_apply_in_order_and_a_gap_is_refused() -> None:
    registry = UpcasterRegistry({"session.started": 3})

    @registry.register("session.started", from_version=1)
    def rename_objective(data: dict[str, Any]) -> dict[str, Any]:
        data["goal"] = data.pop("objective")
        return data

    @registry.register("session.started", from_version=2)
    def add_mode(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "mode": "playbook"}

    old = {"type": "session.started", "schemaversion": 1, "data": {"objective": "x"}}
    upcast = registry.upcast(old)
    assert upcast["schemaversion"] == 3
    assert upcast["data"] == {"goal": "x", "mode": "playbook"}
    assert old["data"] == {"objective": "x"}, "the input document is left alone"

    gap = UpcasterRegistry({"session.started": 2})
    with pytest.raises(UnknownSchemaVersion, match="no upcaster"):
        gap.upcast({"type": "session.started", "schemaversion": 1, "data": {}})


def test_an_upcaster_for_an_unknown_type_is_refused() -> None:
    with pytest.raises(UnknownEventType):
        UpcasterRegistry({}).register("nope", from_version=1)


def test_a_playbook_with_a_cycle_names_it() -> None:
    with pytest.raises(ValueError, match="dependency cycle among steps: a -> b -> a"):
        Playbook(
            goal="g",
            steps=(
                PlanStep(id="a", tool="echo", depends_on=("b",)),
                PlanStep(id="b", tool="echo", depends_on=("a",)),
            ),
        )
    with pytest.raises(ValueError, match="unknown step 'c'"):
        Playbook(goal="g", steps=(PlanStep(id="a", tool="echo", depends_on=("c",)),))


def test_subjects_round_trip() -> None:
    subject = event_subject("acme", "s1", "tool.call.completed")
    assert subject == "helmline.events.acme.s1.tool.call.completed"
    assert parse_event_subject(subject) == ("acme", "s1", "tool.call.completed")
    with pytest.raises(ValueError, match="not an event subject"):
        parse_event_subject("helmline.events.acme")


def _estimated(step_id: str, seconds: float | None, *after: str) -> PlanStep:
    return PlanStep(id=step_id, tool="echo", depends_on=after, estimated_duration_s=seconds)


def test_a_plan_is_estimated_by_its_longest_chain_of_steps() -> None:
    diamond = (
        _estimated("fetch", 2),
        _estimated("left", 5, "fetch"),
        _estimated("right", 1, "fetch"),
        _estimated("join", 0.5, "left", "right"),
        _estimated("aside", 4),
    )
    assert critical_path_s(diamond) == 7.5  # fetch, left, join; aside runs alongside
    # A dependency on a step an earlier plan completed adds nothing.
    assert critical_path_s((_estimated("next", 3, "done.earlier"),)) == 3
    assert critical_path_s((*diamond, _estimated("unknown", None))) is None


def test_a_plan_requires_no_more_criteria_than_it_declares() -> None:
    criteria = ("built", "tested")
    steps = (PlanStep(id="a", tool="echo"),)
    plan = PlanProposed(revision=1, steps=steps, completion_criteria=criteria, criteria_required=2)
    assert plan.criteria_required == 2
    with pytest.raises(ValueError, match="criteria_required is 3, but the plan declares 2"):
        PlanProposed(revision=1, steps=steps, completion_criteria=criteria, criteria_required=3)
