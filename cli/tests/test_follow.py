"""Following a session (`run --wait`, a rollback) against a real JetStream: each event is
folded once, and states are taken when what a waiter looks at changes, or at a bounded
rate, never once per event (a state costs in proportion to the session's length)."""

from __future__ import annotations

import asyncio
import io

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from rich.console import Console

from helmline.cli._connection import EventLog
from helmline.cli._sessions import needs_a_person, watch
from helmline.cli._watch import FINAL_ROWS, SessionProgress
from helmline.contracts import (
    Actor,
    ApprovalRequested,
    Event,
    Payload,
    PlanProposed,
    PlanStep,
    Playbook,
    SessionCompleted,
    SessionFold,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallStarted,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import eventually

STEPS = 150


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """Every event any fold applies while the test runs, in order."""
    seen: list[Event] = []
    apply = SessionFold.apply

    def counted(folding: SessionFold, event: Event) -> None:
        seen.append(event)
        apply(folding, event)

    monkeypatch.setattr(SessionFold, "apply", counted)
    return seen


def _echoes(steps: int) -> Playbook:
    return Playbook(
        goal=f"{steps} echoes",
        steps=tuple(
            PlanStep(id=f"s{i}", tool="echo", arguments={"message": f"step {i}"})
            for i in range(steps)
        ),
    )


async def _start(store: EventStore, tenant: str, playbook: Playbook) -> Event:
    started = new_event(
        SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=Actor(id="test")),
        tenant=tenant,
        session_id="long",
        source="helmline/test",
    )
    await store.append(started, expected_last_seq=0)
    planned = started.derive(PlanProposed(revision=1, steps=playbook.steps), source="test")
    await store.append(planned)
    return planned


def _step_events(cause: Event, steps: int) -> list[Event]:
    """What the services append for each step: scheduled, authorised, started, completed."""
    payloads: list[Payload] = []
    for i in range(steps):
        step, call = f"s{i}", f"c{i}"
        payloads += [
            StepScheduled(step_id=step, call_id=call, tool="echo"),
            ToolCallAuthorized(call_id=call, step_id=step, tool="echo", risk="low"),
            ToolCallStarted(call_id=call, step_id=step, tool="echo"),
            ToolCallCompleted(call_id=call, step_id=step, tool="echo", output=f"step {i}"),
        ]
    return [cause.derive(p, source="test", key=str(n)) for n, p in enumerate(payloads)]


async def test_a_follower_folds_each_event_once_and_takes_a_state_only_when_its_status_changes(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str, applied: list[Event]
) -> None:
    planned = await _start(store, tenant, _echoes(STEPS))
    handed: list[SessionState] = []
    following = asyncio.create_task(
        # No refresh while the test runs: states come only from changes a waiter looks at.
        watch(EventLog(nc, js, store), tenant, "long", on_change=handed.append, refresh_s=3600)
    )
    await eventually(lambda: handed, what="the log so far folded")
    events = _step_events(planned, STEPS)
    await store.append_pipelined(events)
    await store.append(events[-1].derive(SessionCompleted(summary="done"), source="test"))

    final = await asyncio.wait_for(following, timeout=30)

    assert final.status == "completed"
    assert final.event_count == 2 + 4 * STEPS + 1
    assert all(step.status == "succeeded" for step in final.steps.values())
    # Read once: each event of the log folded once, none again.
    assert [event.id for event in applied] == [
        stored.event.id for stored in await store.read_all(tenant, "long")
    ]
    # The log so far; executing, at the first step scheduled; completed.
    assert [state.status for state in handed] == ["planning", "executing", "completed"]


async def test_a_follower_stops_where_the_session_waits_for_a_person(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    planned = await _start(store, tenant, _echoes(STEPS))
    following = asyncio.create_task(
        watch(EventLog(nc, js, store), tenant, "long", on_change=lambda _: None, refresh_s=3600)
    )
    events = _step_events(planned, STEPS - 1)
    asked = events[-1].derive(
        ApprovalRequested(
            request_id="r1",
            scope="step",
            step_id=f"s{STEPS - 1}",
            call_id="c-last",
            tool="echo",
            risk="high",
            reason="asked",
            expires_at=planned.time.replace(year=planned.time.year + 1),
        ),
        source="test",
    )
    await store.append_pipelined([*events, asked])

    final = await asyncio.wait_for(following, timeout=30)

    assert needs_a_person(final)
    assert final.event_count == 2 + 4 * (STEPS - 1) + 1


async def test_a_follower_hands_on_the_last_change_when_events_stop_coming(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    planned = await _start(store, tenant, _echoes(STEPS))
    handed: list[SessionState] = []
    following = asyncio.create_task(
        watch(EventLog(nc, js, store), tenant, "long", on_change=handed.append, refresh_s=0.05)
    )
    try:
        await eventually(lambda: handed, what="the log so far folded")
        # Neither the status nor an approval changes after the first of these.
        await store.append_pipelined(_step_events(planned, STEPS))

        await eventually(
            lambda: handed[-1].event_count == 2 + 4 * STEPS, what="the last event handed on"
        )
        assert handed[-1].steps[f"s{STEPS - 1}"].status == "succeeded"
        assert len(handed) < 4 * STEPS
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


def test_the_view_left_at_the_end_lists_what_did_not_succeed_and_names_the_rest() -> None:
    steps = 3 * FINAL_ROWS
    planned = new_event(
        PlanProposed(revision=1, steps=_echoes(steps).steps),
        tenant="t",
        session_id="long",
        source="helmline/test",
    )
    folding = SessionFold()
    folding.apply(planned)
    # Every step but the last two succeeded; the one before last failed.
    for event in _step_events(planned, steps - 2):
        folding.apply(event)
    folding.apply(
        planned.derive(StepScheduled(step_id=f"s{steps - 2}", call_id="c", tool="echo"), source="t")
    )
    console = Console(file=io.StringIO(), width=160)

    with SessionProgress(console) as progress:
        progress.update(folding.state())

    shown = console.file.getvalue()  # type: ignore[attr-defined]
    # The two not succeeded, and the last that succeeded before them.
    listed = {f"s{i}" for i in range(steps - FINAL_ROWS, steps)}
    assert all(f"{step} " in shown for step in listed)
    assert not any(f"s{i} " in shown for i in range(steps - FINAL_ROWS))
    left_out = steps - FINAL_ROWS
    assert f"{left_out} more steps not listed, {left_out} of them succeeded:" in shown
    assert "helmline show long lists every step" in shown


def test_a_view_of_steps_that_fit_lists_them_all() -> None:
    planned = new_event(
        PlanProposed(revision=1, steps=_echoes(FINAL_ROWS).steps),
        tenant="t",
        session_id="short",
        source="helmline/test",
    )
    folding = SessionFold()
    folding.apply(planned)
    for event in _step_events(planned, FINAL_ROWS):
        folding.apply(event)
    console = Console(file=io.StringIO(), width=160)

    with SessionProgress(console) as progress:
        progress.update(folding.state())

    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert all(f"s{i} " in shown for i in range(FINAL_ROWS))
    assert "not listed" not in shown
