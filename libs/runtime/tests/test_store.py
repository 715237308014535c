"""The event store against a real JetStream: concurrency, de-duplication, replay."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    EVENTS_STREAM,
    Actor,
    Event,
    PlanProposed,
    PlanStep,
    SessionStarted,
    StepScheduled,
    ThoughtRecorded,
    new_event,
)
from helmline.runtime import ConcurrencyConflict, EventsOfType, EventStore, EventTooLarge
from helmline.runtime.testing import session_started


def _thought(cause: Event, text: str) -> Event:
    return cause.derive(ThoughtRecorded(kind="reasoning", text=text), source="test", key=text)


async def test_two_appends_expecting_the_same_sequence_one_wins(
    store: EventStore, tenant: str
) -> None:
    started = session_started(tenant, "s1")
    first = await store.append(started, expected_last_seq=0)

    results = await asyncio.gather(
        store.append(_thought(started, "a"), expected_last_seq=first.seq),
        store.append(_thought(started, "b"), expected_last_seq=first.seq),
        return_exceptions=True,
    )

    conflicts = [r for r in results if isinstance(r, ConcurrencyConflict)]
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(conflicts) == 1
    assert len(winners) == 1
    assert conflicts[0].expected_last_seq == first.seq
    assert await store.last_seq(tenant, "s1") == winners[0].seq


async def test_a_new_session_must_expect_zero(store: EventStore, tenant: str) -> None:
    await store.append(session_started(tenant, "s1"), expected_last_seq=0)
    with pytest.raises(ConcurrencyConflict):
        await store.append(session_started(tenant, "s1"), expected_last_seq=0)


async def test_the_same_event_appended_twice_is_stored_once(store: EventStore, tenant: str) -> None:
    started = session_started(tenant, "s1")
    first = await store.append(started)
    again = await store.append(started)
    assert again.duplicate
    assert again.seq == first.seq
    stored = [item async for item in store.read(tenant, "s1")]
    assert [item.event for item in stored] == [started]


def _labelled(tenant: str, session_id: str, size: int) -> Event:
    return new_event(
        SessionStarted(goal="g", requested_by=Actor(id="ana"), labels={"big": "x" * size}),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )


async def test_an_event_larger_than_the_log_takes_is_refused_before_it_is_sent(
    store: EventStore, tenant: str
) -> None:
    limit = EVENTS_STREAM.max_msg_size
    with pytest.raises(EventTooLarge) as refused:
        await store.append(_labelled(tenant, "s1", limit))
    assert refused.value.limit == limit
    assert "session.started event of" in str(refused.value)
    with pytest.raises(EventTooLarge):
        await store.append_pipelined([_labelled(tenant, "s1", limit)])
    assert await store.last_seq(tenant, "s1") == 0

    # Counted as JetStream counts it: an event of exactly the limit is stored, one byte
    # more is not sent.
    exactly = _labelled(tenant, "s1", limit - (refused.value.size - limit))
    assert (await store.append(exactly)).seq > 0
    with pytest.raises(EventTooLarge):
        await store.append(_labelled(tenant, "s2", limit - (refused.value.size - limit) + 1))


async def test_pipelined_events_are_stored_in_the_order_given_and_once(
    store: EventStore, tenant: str
) -> None:
    started = session_started(tenant, "s1")
    await store.append(started)
    thoughts = [_thought(started, str(index)) for index in range(50)]

    first = await store.append_pipelined(thoughts[:30])
    again = await store.append_pipelined(thoughts)

    assert [a.seq for a in first] == sorted(a.seq for a in first)
    assert [a.duplicate for a in again] == [True] * 30 + [False] * 20
    assert [a.seq for a in again[:30]] == [a.seq for a in first]
    stored = [item.event for item in await store.read_all(tenant, "s1")]
    assert stored == [started, *thoughts]


async def test_other_sessions_do_not_move_a_session_sequence(
    store: EventStore, tenant: str
) -> None:
    mine = await store.append(session_started(tenant, "mine"), expected_last_seq=0)
    await store.append(session_started(tenant, "other"), expected_last_seq=0)
    thought = _thought(session_started(tenant, "mine"), "still mine")
    appended = await store.append(thought, expected_last_seq=mine.seq)
    assert appended.seq > mine.seq


async def test_an_event_is_read_at_its_sequence_only_as_its_own_sessions(
    store: EventStore, tenant: str
) -> None:
    mine = await store.append(session_started(tenant, "mine"), expected_last_seq=0)
    other = await store.append(session_started(tenant, "other"), expected_last_seq=0)
    found = await store.read_at(tenant, "mine", mine.seq)
    assert found is not None
    assert (found.seq, found.event.session_id) == (mine.seq, "mine")
    assert await store.read_at(tenant, "mine", other.seq) is None
    assert await store.read_at(tenant, "mine", other.seq + 1000) is None


async def test_events_of_a_type_are_read_since_a_time_with_the_last_of_them(
    store: EventStore, tenant: str
) -> None:
    started = session_started(tenant, "s1")
    await store.append(started)
    assert await store.read_since(tenant, "s1", "thought.recorded", since=started.time) == (
        EventsOfType([], 0)
    )
    old = await store.append(_thought(started, "old"))
    await store.append(session_started(tenant, "s2"))  # Another session's events count not.
    between = datetime.now(UTC)
    recent = [await store.append(_thought(started, text)) for text in ("a", "b")]
    await store.append(
        started.derive(StepScheduled(step_id="x", call_id="x", tool="echo"), source="t")
    )

    read = await store.read_since(tenant, "s1", "thought.recorded", since=between)

    assert [stored.seq for stored in read.events] == [a.seq for a in recent]
    assert read.last_seq == recent[-1].seq
    later = await store.read_since(tenant, "s1", "thought.recorded", since=datetime.now(UTC))
    assert later == EventsOfType([], recent[-1].seq)  # None since, the last one still known.
    assert old.seq < recent[0].seq


async def test_an_append_expecting_the_last_of_its_type_fails_once_another_came(
    store: EventStore, tenant: str
) -> None:
    started = session_started(tenant, "s1")
    await store.append(started)
    counted = await store.read_since(tenant, "s1", "thought.recorded", since=started.time)
    # Events of other types do not stand in its way.
    await store.append(
        started.derive(StepScheduled(step_id="x", call_id="x", tool="echo"), source="t")
    )

    results = await asyncio.gather(
        store.append(_thought(started, "a"), expected_last_of_type=counted.last_seq),
        store.append(_thought(started, "b"), expected_last_of_type=counted.last_seq),
        return_exceptions=True,
    )

    conflicts = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert len(conflicts) == 1
    assert conflicts[0].event_type == "thought.recorded"
    assert "thought.recorded events moved past sequence 0" in str(conflicts[0])
    with pytest.raises(ValueError, match="not both"):
        await store.append(_thought(started, "c"), expected_last_seq=0, expected_last_of_type=0)


async def test_replay_from_any_sequence_and_fold(store: EventStore, tenant: str) -> None:
    started = session_started(tenant, "s1")
    plan = started.derive(
        PlanProposed(
            revision=1,
            steps=(PlanStep(id="a", tool="echo"), PlanStep(id="b", tool="echo", depends_on=("a",))),
        ),
        source="test",
    )
    scheduled = plan.derive(StepScheduled(step_id="a", call_id="c1", tool="echo"), source="test")
    appended = await store.append_all([started, plan, scheduled], expected_last_seq=0)

    everything = [item async for item in store.read(tenant, "s1")]
    assert [item.seq for item in everything] == [a.seq for a in appended]
    after_first = [item.event async for item in store.read(tenant, "s1", after_seq=appended[0].seq)]
    assert after_first == [plan, scheduled]
    up_to_plan = await store.load(tenant, "s1", up_to_seq=appended[1].seq)
    assert up_to_plan.last_seq == appended[1].seq
    assert up_to_plan.state.steps["a"].status == "pending"
    now = await store.load(tenant, "s1")
    assert now.state.steps["a"].status == "scheduled"
    assert now.state.status == "executing"


async def test_a_session_longer_than_one_read_is_read_whole_in_order(
    store: EventStore, tenant: str
) -> None:
    started, other = session_started(tenant, "s1"), session_started(tenant, "another")
    thoughts = [_thought(started, str(index)) for index in range(2_345)]
    # Another session's events in between, which no read of s1 may return.
    mixed = [e for i, t in enumerate(thoughts) for e in (t, _thought(other, str(i)))]
    results = await store.append_pipelined([started, *mixed])
    appended = [results[0], *results[1::2]]

    everything = await store.read_all(tenant, "s1")
    assert [item.seq for item in everything] == [a.seq for a in appended]
    assert [item.event for item in everything] == [started, *thoughts]
    middle = appended[1_500].seq
    window = await store.read_all(tenant, "s1", after_seq=appended[999].seq, up_to_seq=middle)
    assert [item.seq for item in window] == [a.seq for a in appended[1_000:1_501]]
    assert (await store.load(tenant, "s1", up_to_seq=middle)).state.event_count == 1_501

    # A page at a time, each read as far as it holds (more than one direct get's batch).
    paged: list[int] = []
    more, after = True, 0
    while more:
        page, more = await store.read_page(tenant, "s1", after_seq=after, limit=400)
        assert len(page) == (400 if more else len(appended) % 400)
        paged += [item.seq for item in page]
        after = page[-1].seq
    assert paged == [a.seq for a in appended]
    ended, more = await store.read_page(tenant, "s1", after_seq=after, limit=400)
    assert (ended, more) == ([], False)


async def test_an_unknown_session_is_empty(store: EventStore, tenant: str) -> None:
    missing = f"s{uuid.uuid4().hex[:8]}"
    assert [item async for item in store.read(tenant, missing)] == []
    snapshot = await store.load(tenant, missing)
    assert snapshot.last_seq == 0
    assert snapshot.state.event_count == 0


async def test_replays_leave_no_consumer_behind(
    store: EventStore, js: JetStreamContext, tenant: str
) -> None:
    # The server holds at most 1,000 consumers; each replay makes one, and one left behind
    # would linger for seconds after it ends.
    await store.append(session_started(tenant, "s1"))
    before = (await js.stream_info(EVENTS_STREAM.name)).state.consumer_count
    for _ in range(20):
        assert (await store.load(tenant, "s1")).last_seq > 0
    assert (await js.stream_info(EVENTS_STREAM.name)).state.consumer_count == before


async def test_a_read_is_answered_only_by_a_replica_holding_the_sequence_it_knows_of(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    # A replica of a clustered stream that is behind answers without the events it lacks;
    # a read that must reach a sequence asks again until an answer holds it. One no replica
    # will ever hold leaves the read waiting until its timeout, never answered from behind.
    started = session_started(tenant)
    seq = (await store.append(started)).seq
    assert [s.seq for s in await store.read_all(tenant, started.session_id, known_seq=seq)] == [seq]

    impatient = EventStore(js, timeout_s=0.3)
    with pytest.raises(TimeoutError, match=f"answered up to {seq + 1_000_000}"):
        await impatient.read_all(tenant, started.session_id, known_seq=seq + 1_000_000)
