"""Replay a 10,000-event session from JetStream and fold it, against the raw read rate; and
what folding one more event costs a service, in a short session and a long one."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from helmline.contracts import (
    Actor,
    CheckpointCreated,
    Event,
    PlanProposed,
    PlanStep,
    SessionFold,
    SessionStarted,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallStarted,
    encode_event,
    event_subject,
    evolve,
    fold,
    new_event,
    session_filter,
)
from helmline.runtime import EventStore, FoldedStates, ensure_topology
from helmline.runtime.testing import NatsServer

EVENTS = 10_000
LONGER_STEPS = 5_000
LONGEST_STEPS = 10_000
STORED_LONGER_STEPS = 4_000
"""The longer session whose states are stored: its plan must fit in one event (1 MiB holds
about 4,500 of these steps)."""
"""The longest session measured: one more event should cost there what it costs at 200."""
ROUNDS = 3


def session_events(count: int, session_id: str = "replay") -> list[Event]:
    """A session as the services write it: a plan, then five events per step."""
    steps = -(-(count - 2) // 5)
    started = new_event(
        SessionStarted(goal="replay benchmark", requested_by=Actor(id="bench")),
        tenant="bench",
        session_id=session_id,
        source="bench",
    )
    plan = PlanProposed(
        revision=1,
        steps=tuple(
            PlanStep(
                id=f"s{i}",
                tool="echo",
                arguments={"message": f"step {i}"},
                depends_on=(f"s{i - 1}",) if i else (),
            )
            for i in range(steps)
        ),
    )
    events = [started, started.derive(plan, source="bench")]
    for i in range(steps):
        step, call = f"s{i}", f"c{i}"
        arguments = {"message": f"step {i}"}
        events += [
            started.derive(
                StepScheduled(step_id=step, call_id=call, tool="echo", arguments=arguments),
                source="planner",
                key=step,
            ),
            started.derive(
                ToolCallAuthorized(
                    call_id=call,
                    step_id=step,
                    tool="echo",
                    arguments=arguments,
                    risk="low",
                    rule="allow-all",
                ),
                source="approval",
                key=step,
            ),
            started.derive(
                ToolCallStarted(call_id=call, step_id=step, tool="echo"), source="gateway", key=step
            ),
            started.derive(
                ToolCallCompleted(
                    call_id=call,
                    step_id=step,
                    tool="echo",
                    output={"message": f"step {i}"},
                    duration_ms=0.05,
                ),
                source="gateway",
                key=step,
            ),
            started.derive(
                CheckpointCreated(
                    checkpoint_id=f"k{i}", step_id=step, call_id=call, at_seq=len(events) + 4
                ),
                source="state",
                key=step,
            ),
        ]
    return events[:count]


@contextlib.asynccontextmanager
async def event_store() -> AsyncIterator[tuple[JetStreamContext, EventStore]]:
    """A nats-server of its own (in a temporary folder) with Helmline's streams, and the
    event store on it."""
    with tempfile.TemporaryDirectory() as folder, NatsServer(Path(folder)) as server:
        connection = await nats.connect(server.url)
        try:
            js = connection.jetstream()
            await ensure_topology(js)
            yield js, EventStore(js)
        finally:
            await connection.close()


async def publish(js: JetStreamContext, events: list[Event]) -> None:
    """Append a session's events as fast as JetStream takes them."""
    for event in events:
        await js.publish_async(
            event_subject(event.tenant, event.session_id, event.type), encode_event(event)
        )
    await js.publish_async_completed()


def evolve_us_per_event(steps: int) -> float:
    """What a service's cached state costs per event it is handed, in a session of `steps`
    steps: the last 50 steps' events folded one at a time, as deliveries are."""
    events = session_events(2 + 5 * steps)
    tail = events[-5 * 50 :]
    state = fold(events[: -len(tail)])
    began = time.perf_counter()
    for event in tail:
        state = evolve(state, event)
    return (time.perf_counter() - began) / len(tail) * 1e6


async def raw_ordered_read(js: Any, subject: str, count: int) -> float:
    """Messages per second of nats-py's ordered consumer, doing nothing with them."""
    received = 0
    done = asyncio.Event()

    async def count_one(message: Msg) -> None:
        nonlocal received
        received += 1
        if received == count:
            done.set()

    began = time.perf_counter()
    subscription = await js.subscribe(
        subject,
        ordered_consumer=True,
        cb=count_one,
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1 << 30,
    )
    await asyncio.wait_for(done.wait(), timeout=120)
    elapsed = time.perf_counter() - began
    await subscription.unsubscribe()
    return count / elapsed


async def run() -> list[dict[str, Any]]:
    async with event_store() as (js, store):
        await publish(js, session_events(EVENTS))
        raw_rates, fold_rates = [], []
        for _ in range(ROUNDS):
            raw_rates.append(await raw_ordered_read(js, session_filter("bench", "replay"), EVENTS))
            began = time.perf_counter()
            snapshot = await store.load("bench", "replay")
            fold_rates.append(EVENTS / (time.perf_counter() - began))
            assert snapshot.state.event_count == EVENTS
    raw, folded = statistics.median(raw_rates), statistics.median(fold_rates)
    return [
        {
            "figure": "replay_fold_events_per_s",
            "events": EVENTS,
            "value": round(folded),
            "raw_ordered_read_per_s": round(raw),
            "raw_over_fold": round(raw / folded, 2),
            "target": ">= 50000 events/s and raw_over_fold <= 3",
        },
        *(
            {
                "figure": "evolve_one_event_us",
                "steps": steps,
                "value": round(
                    statistics.median(evolve_us_per_event(steps) for _ in range(ROUNDS)), 1
                ),
                "target": "what a service pays per event it folds: at 10,000 steps <= 1.5x "
                "its value at 200",
            }
            for steps in (200, LONGER_STEPS, LONGEST_STEPS)
        ),
    ]


async def _keep_up_us_per_event(
    states: FoldedStates, session_id: str, first_seq: int, events: int
) -> float:
    """What the state service does after each step's checkpoint (here one step is five
    events) of a session stored from `first_seq` on: now and then it stores the folded
    state. Steps come faster here than in a session, so no call waits out the interval
    between reads of the session: the states stored are the same, only sooner.
    Microseconds per event of the session."""
    began = time.perf_counter()
    for seq in range(first_seq + 6, first_seq + events, 5):
        await states.keep_up("bench", session_id, seq)
    return (time.perf_counter() - began) * 1e6 / events


async def time_travel() -> list[dict[str, Any]]:
    """State at the middle of a 1,000-step session, and every intermediate state of it."""
    events = session_events(2 + 5 * 1000)
    async with event_store() as (js, store):
        await publish(js, events)
        middle = len(events) // 2
        began = time.perf_counter()
        snapshot = await store.load("bench", "replay", up_to_seq=middle)
        replayed_ms = (time.perf_counter() - began) * 1000
        assert snapshot.last_seq == middle
        states = FoldedStates(js, store, interval_s=0)
        keeping_us = await _keep_up_us_per_event(states, "replay", 1, len(events))
        timings = []
        for _ in range(5):
            began = time.perf_counter()
            traveled = await states.load("bench", "replay", up_to_seq=middle)
            timings.append((time.perf_counter() - began) * 1000)
            assert traveled.state == snapshot.state
        at_middle_ms = statistics.median(timings)
        # What a service pays on meeting the session late (after a restart, say): its
        # state at the last event, from the nearest stored state rather than the whole log.
        began = time.perf_counter()
        whole = await store.load("bench", "replay")
        whole_log_ms = (time.perf_counter() - began) * 1000
        timings = []
        for _ in range(5):
            began = time.perf_counter()
            caught_up = await FoldedStates(js, store).load("bench", "replay", log_first=True)
            timings.append((time.perf_counter() - began) * 1000)
            assert caught_up.state == whole.state
        at_end_ms = statistics.median(timings)
        # States are spaced in proportion to their size: keeping them costs each event about
        # the same however long the session grows (evenly spaced, it grew with the session).
        longer = session_events(2 + 5 * STORED_LONGER_STEPS, session_id="longer")
        await publish(js, longer)
        keeping_longer_us = await _keep_up_us_per_event(
            states, "longer", len(events) + 1, len(longer)
        )
    began = time.perf_counter()
    folding = SessionFold()
    states = []
    for event in events:
        folding.apply(event)
        states.append(folding.state())
    every_state_s = time.perf_counter() - began
    return [
        {
            "figure": "state_at_middle_of_1000_steps_ms",
            "events": middle,
            "value": round(at_middle_ms, 1),
            "replaying_the_whole_prefix_ms": round(replayed_ms, 1),
            "target": "<= 50 ms",
        },
        {
            "figure": "state_at_end_of_1000_steps_ms",
            "events": len(events),
            "value": round(at_end_ms, 1),
            "replaying_the_whole_log_ms": round(whole_log_ms, 1),
            "target": "a service's cache miss on a long session: far less than the replay",
        },
        {
            "figure": "keeping_stored_states_us_per_event",
            "steps": 1000,
            "value": round(keeping_us, 1),
            f"at_{STORED_LONGER_STEPS}_steps": round(keeping_longer_us, 1),
            "target": f"about the same per event at {STORED_LONGER_STEPS:,} steps as at 1,000",
        },
        {
            "figure": "every_state_of_1000_steps_s",
            "states": len(states),
            "value": round(every_state_s, 3),
            "target": "<= 1 s",
        },
    ]
