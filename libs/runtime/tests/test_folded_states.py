"""Time travel through stored folded states: the state at every sequence equals the fold of
the log up to there, whichever stored state it starts from."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from helmline.contracts import (
    EVENTS_STREAM,
    SESSION_STATES_BUCKET,
    Actor,
    ApprovalGranted,
    ApprovalRequested,
    CheckpointCreated,
    CompensationCompleted,
    CompensationScheduled,
    Event,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    Playbook,
    RollbackCompleted,
    RollbackRequested,
    SessionCompleted,
    SessionStarted,
    StepScheduled,
    ThoughtRecorded,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallStarted,
    WorkspaceSnapshotted,
    fold,
    new_event,
    session_filter,
)
from helmline.runtime import Delivery, EventStore, FoldedStates, LogStates, SessionCache
from helmline.runtime._folded_states import GROWTH
from helmline.runtime._store import DIRECT_BATCH

ANA = Actor(id="ana", roles=("approver",))
STEPS = 50


def fifty_steps(tenant: str, session_id: str) -> list[Event]:
    """A 50-step session with approvals, thoughts, snapshots, checkpoints and a rollback."""
    playbook = Playbook(
        goal="fifty",
        steps=tuple(PlanStep(id=f"s{i}", tool="write_file") for i in range(STEPS)),
    )
    root = new_event(
        SessionStarted(goal="fifty", playbook=playbook, requested_by=ANA),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    payloads: list[Payload] = [
        PlanProposed(revision=1, steps=playbook.steps),
        PlanApproved(revision=1, approved_by=ANA),
    ]
    for i in range(STEPS):
        step, call = f"s{i}", f"s{i}.1"
        arguments = {"path": f"f{i}.txt", "content": str(i)}
        payloads.append(StepScheduled(step_id=step, call_id=call, tool="write_file"))
        if i % 7 == 0:
            payloads += [
                ApprovalRequested(
                    request_id=call,
                    scope="step",
                    step_id=step,
                    call_id=call,
                    tool="write_file",
                    risk="high",
                    reason="policy",
                    expires_at=datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=i),
                ),
                ApprovalGranted(request_id=call, decided_by=(ANA,)),
            ]
        if i % 5 == 0:
            payloads.append(ThoughtRecorded(kind="reasoning", text=f"on to {step}", step_id=step))
        payloads += [
            ToolCallAuthorized(
                call_id=call, step_id=step, tool="write_file", arguments=arguments, risk="medium"
            ),
            ToolCallStarted(call_id=call, step_id=step, tool="write_file"),
            WorkspaceSnapshotted(snapshot_id=f"snap-{i}", call_id=call, files=i + 1),
            ToolCallCompleted(call_id=call, step_id=step, tool="write_file", output={"bytes": i}),
            CheckpointCreated(
                checkpoint_id=f"cp-{call}",
                step_id=step,
                call_id=call,
                at_seq=1 + len(payloads),
                snapshot_id=f"snap-{i}",
                effect="workspace",
            ),
        ]
    undo = {"rollback_id": "rb", "compensation_id": "rb.undo1", "step_id": "s49"}
    payloads += [
        RollbackRequested(rollback_id="rb", checkpoint_id="cp-s47.1", requested_by=ANA),
        CompensationScheduled(
            **undo, kind="restore_workspace", snapshot_id="snap-47", steps=("s49", "s48")
        ),
        CompensationCompleted(**undo, steps=("s49", "s48")),
        RollbackCompleted(rollback_id="rb", checkpoint_id="cp-s47.1", undone_steps=("s49", "s48")),
    ]
    return [root] + [
        root.derive(payload, source="test", key=str(index))
        for index, payload in enumerate(payloads)
    ]


async def test_the_state_at_every_sequence_of_a_50_step_session_is_the_fold_of_that_prefix(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "fifty")
    other = fifty_steps(tenant, "other")
    states = FoldedStates(js, store, every=40, interval_s=0)
    seqs: list[int] = []
    stored = 0
    # Another session's events lie between, as on a busy log.
    for mine, theirs in zip(events, other, strict=True):
        seqs.append((await store.append(mine)).seq)
        await store.append(theirs)
        stored += await states.keep_up(tenant, "fifty", seqs[-1])
    assert stored >= 5

    for index, seq in enumerate(seqs):
        snapshot = await states.load(tenant, "fifty", up_to_seq=seq)
        assert snapshot.last_seq == seq
        assert snapshot.state == fold(events[: index + 1]), f"at sequence {seq}"
    latest = await states.load(tenant, "fifty")
    assert latest.state == fold(events)
    assert latest.state.status == "paused"


async def test_a_damaged_stored_state_is_passed_over_for_the_log(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "damaged")[:60]
    states = FoldedStates(js, store, every=20, interval_s=0)
    for event in events:
        seq = (await store.append(event)).seq
        await states.keep_up(tenant, "damaged", seq)
    bucket = await js.key_value(SESSION_STATES_BUCKET.bucket)
    for key in await state_keys(js):
        if f".{tenant}.damaged." in key and not key.endswith(".index"):
            await bucket.put(key, b"not a folded state")

    assert (await states.load(tenant, "damaged")).state == fold(events)


async def state_keys(js: JetStreamContext) -> list[str]:
    """Every key the bucket has held, off its stream's subjects (nats-py's `keys()` may
    answer none at all: nats-io/nats.py#842)."""
    info = await js.stream_info(f"KV_{SESSION_STATES_BUCKET.bucket}", subjects_filter=">")
    prefix = f"$KV.{SESSION_STATES_BUCKET.bucket}."
    return [subject.removeprefix(prefix) for subject in info.state.subjects or {}]


async def stored_seqs(js: JetStreamContext, tenant: str, session_id: str) -> list[int]:
    """The session's index of stored states, as the bucket holds it."""
    bucket = await js.key_value(SESSION_STATES_BUCKET.bucket)
    (key,) = [key for key in await state_keys(js) if key.endswith(f".{tenant}.{session_id}.index")]
    seqs: list[int] = json.loads((await bucket.get(key)).value or b"[]")
    return seqs


@asynccontextmanager
async def requests_seen(
    nc: NATS, subject: str, wanted: Callable[[Msg], bool] = lambda _: True
) -> AsyncIterator[list[Msg]]:
    """Every request on `subject` that `wanted` picks, as the server receives them."""
    seen: list[Msg] = []

    async def received(message: Msg) -> None:
        if wanted(message):
            seen.append(message)

    subscription = await nc.subscribe(subject, cb=received)
    await nc.flush()
    try:
        yield seen
    finally:
        await nc.flush()  # Every request sent before has reached this subscription too.
        await subscription.unsubscribe()


def index_reads(nc: NATS, tenant: str, session_id: str) -> AbstractAsyncContextManager[list[Msg]]:
    """Every request reading the session's index."""
    key = f".{tenant}.{session_id}.index"
    # A get names the key in its subject (direct) or in its body.
    return requests_seen(
        nc,
        "$JS.API.>",
        lambda m: (
            SESSION_STATES_BUCKET.bucket in m.subject
            and (key in m.subject or key in m.data.decode())
        ),
    )


def session_reads(nc: NATS, tenant: str, session_id: str) -> AbstractAsyncContextManager[list[Msg]]:
    """Every direct get of the session's events."""
    return requests_seen(
        nc,
        f"$JS.API.DIRECT.GET.{EVENTS_STREAM.name}",
        lambda m: session_filter(tenant, session_id) in m.data.decode(),
    )


def replays(nc: NATS) -> AbstractAsyncContextManager[list[Msg]]:
    """Every consumer created on the events stream (a replay streams through one)."""
    return requests_seen(nc, f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM.name}.>")


async def append_and_keep_up(
    store: EventStore, writers: list[FoldedStates], events: list[Event]
) -> tuple[list[int], list[int]]:
    """Append the events, handing each sequence to the next writer in turn (replicas sharing
    a consumer); the sequences and those a state was stored at."""
    seqs: list[int] = []
    stored: list[int] = []
    for index, event in enumerate(events):
        seqs.append((await store.append(event)).seq)
        writer = writers[index % len(writers)]
        if await writer.keep_up(event.tenant, event.session_id, seqs[-1]):
            stored.append(seqs[-1])
    return seqs, stored


async def assert_time_travel_folds(
    states: FoldedStates, events: list[Event], seqs: list[int]
) -> None:
    for index, seq in enumerate(seqs):
        snapshot = await states.load(events[0].tenant, events[0].session_id, up_to_seq=seq)
        assert snapshot.state == fold(events[: index + 1]), f"at sequence {seq}"


def due_positions(events: int, every: int, growth: float) -> list[int]:
    """After how many of a session's events a state is stored: every `every` events, and
    once the stored states are long, a `growth` share of the last one's events later."""
    positions = [every]
    while (following := positions[-1] + max(every, int(growth * positions[-1]))) <= events:
        positions.append(following)
    return positions


async def test_a_writer_stores_states_spaced_by_a_share_of_their_events_and_reads_the_index_once(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "cadence")
    states = FoldedStates(js, store, every=20, growth=0.1, interval_s=0)
    async with index_reads(nc, tenant, "cadence") as reads:
        seqs, stored = await append_and_keep_up(store, [states], events)

    assert len(reads) == 1  # Known from then on: a call that stores nothing asks nothing.
    positions = due_positions(len(events), 20, 0.1)
    assert positions[:10] == list(range(20, 201, 20))
    assert positions[10:13] == [220, 242, 266]  # Past 200 events, a tenth of the last state.
    assert stored == [seqs[position - 1] for position in positions]
    assert await stored_seqs(js, tenant, "cadence") == stored
    await assert_time_travel_folds(states, events, seqs)


async def test_a_session_among_busy_ones_is_stored_every_few_of_its_own_events(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "among")
    others = [fifty_steps(tenant, f"busy{n}") for n in range(3)]
    states = FoldedStates(js, store, every=20, interval_s=0)
    stored_at: list[int] = []  # Positions in the session's own events.
    seqs: list[int] = []
    for position, (event, *theirs) in enumerate(zip(events, *others, strict=True)):
        seqs.append((await store.append(event)).seq)
        for their in theirs:
            await store.append(their)
        if await states.keep_up(tenant, "among", seqs[-1]):
            stored_at.append(position + 1)

    assert stored_at == due_positions(len(events), 20, GROWTH)
    await assert_time_travel_folds(states, events, seqs)


async def test_a_busy_session_is_read_once_per_interval_and_stored_every_few_events(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "busy")
    now = [0.0]
    states = FoldedStates(js, store, every=20, interval_s=1.0, clock=lambda: now[0])
    seqs: list[int] = []
    async with session_reads(nc, tenant, "busy") as reads:
        for event in events[:100]:
            seqs.append((await store.append(event)).seq)
            assert not await states.keep_up(tenant, "busy", seqs[-1])
        assert len(reads) == 1  # The first call; the rest came within the interval.
        now[0] = 1.0
        seqs.append((await store.append(events[100])).seq)
        assert await states.keep_up(tenant, "busy", seqs[-1])
        assert len(reads) == 2

    # One read caught up on 100 events, and stored the states their cadence asked for.
    assert await stored_seqs(js, tenant, "busy") == [seqs[n] for n in (19, 39, 59, 79, 99)]
    await assert_time_travel_folds(states, events[:101], seqs)


async def test_a_writer_folds_on_from_what_a_cache_read_on_meeting_the_session(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "met")
    seqs = [(await store.append(event)).seq for event in events[:10]]
    now = [0.0]
    states = FoldedStates(js, store, every=20, interval_s=1.0, clock=lambda: now[0])
    # The state service's cache meets the session at its tenth event: it reads the log.
    sessions = SessionCache(states, on_load=states.note_folded)
    await sessions.advance(Delivery(events[9], seqs[9], deliveries=1))

    async with session_reads(nc, tenant, "met") as reads:
        for event in events[10:60]:
            seqs.append((await store.append(event)).seq)
            assert not await states.keep_up(tenant, "met", seqs[-1])
        # That read was the interval's: the session is not read again within it.
        assert reads == []
        now[0] = 1.0
        assert await states.keep_up(tenant, "met", seqs[-1])

    # Then only what followed the cache's fold, never the start again.
    assert [json.loads(read.data)["seq"] for read in reads] == [seqs[9] + 1]
    assert await stored_seqs(js, tenant, "met") == [seqs[19], seqs[39], seqs[59]]
    await assert_time_travel_folds(states, events[:60], seqs)


async def test_a_cache_meeting_a_session_at_its_start_reads_nothing(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "new")
    seqs = [(await store.append(event)).seq for event in events[:3]]
    sessions = SessionCache(FoldedStates(js, store))

    async with session_reads(nc, tenant, "new") as reads:
        started = await sessions.advance(Delivery(events[0], seqs[0], deliveries=1, shared=False))
        later = await sessions.advance_through(
            [
                Delivery(e, seq, deliveries=1, shared=False)
                for e, seq in zip(events[1:3], seqs[1:], strict=True)
            ]
        )
    assert reads == []
    assert started == fold(events[:1])
    assert later == fold(events[:3])
    # Delivered again, the start may have been acted on: the log is read whole then.
    async with session_reads(nc, tenant, "new") as reads:
        again = await sessions.advance(Delivery(events[0], seqs[0], deliveries=2, shared=False))
    assert len(reads) == 1
    assert again == fold(events[:3])


async def test_a_cache_catching_up_on_many_ended_sessions_reads_each_once(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    # As the read model meets the last checkpoints of sessions that ended together, one
    # session after another in turn, while it catches up on a backlog.
    ended = []
    for number in range(300):
        started = new_event(
            SessionStarted(goal="g", requested_by=ANA),
            tenant=tenant,
            session_id=f"ended-{number}",
            source="test",
        )
        done = started.derive(SessionCompleted(summary="done"), source="test")
        await store.append_all([started, done])
        ended.append(done)
    loads: list[str] = []
    sessions = SessionCache(
        FoldedStates(js, store), on_load=lambda _, session, __: loads.append(session)
    )

    for turn in range(3):
        for done in ended:
            late = done.derive(
                CheckpointCreated(checkpoint_id=f"cp{turn}", step_id="s", call_id="c", at_seq=1),
                source="test",
                key=str(turn),
            )
            seq = (await store.append(late)).seq
            await sessions.advance(Delivery(late, seq, deliveries=1, shared=False))

    assert sorted(loads) == sorted(f"ended-{number}" for number in range(300))


async def test_writers_sharing_a_session_index_every_state_due_whichever_stored_it(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "shared")
    replicas = [FoldedStates(js, store, every=20, interval_s=0) for _ in range(2)]
    half = len(events) // 2
    seqs, _ = await append_and_keep_up(store, replicas, events[:half])
    # Both at once, as replicas handed two events of the session together.
    more = [(await store.append(event)).seq for event in events[half : half + 40]]
    seqs += more
    both = await asyncio.gather(
        replicas[0].keep_up(tenant, "shared", more[19]),
        replicas[1].keep_up(tenant, "shared", more[39]),
    )
    assert all(both)
    rest, _ = await append_and_keep_up(store, replicas, events[half + 40 :])
    seqs += rest

    # Every state due, each indexed once, though each replica knew only of the states it
    # stored itself.
    due = due_positions(len(events), 20, GROWTH)
    assert await stored_seqs(js, tenant, "shared") == [seqs[position - 1] for position in due]
    await assert_time_travel_folds(FoldedStates(js, store), events, seqs)


async def test_a_restarted_writer_keeps_the_cadence_and_the_index(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "restart")
    _, before = await append_and_keep_up(
        store, [FoldedStates(js, store, every=20, interval_s=0)], events[:90]
    )
    _, after = await append_and_keep_up(
        store, [FoldedStates(js, store, every=20, interval_s=0)], events[90:]
    )

    assert after[0] - before[-1] == 20
    assert await stored_seqs(js, tenant, "restart") == before + after


async def test_a_writer_whose_stored_states_were_dropped_indexes_only_what_is_stored(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "dropped")
    states = FoldedStates(js, store, every=20, interval_s=0)
    seqs, _ = await append_and_keep_up(store, [states], events[:100])
    bucket = await js.key_value(SESSION_STATES_BUCKET.bucket)
    for key in await state_keys(js):
        if f".{tenant}.dropped." in key:
            await bucket.purge(key)  # The cache dropped; the writer still remembers it.
    more, stored = await append_and_keep_up(store, [states], events[100:])

    assert stored
    assert await stored_seqs(js, tenant, "dropped") == stored
    await assert_time_travel_folds(states, events, seqs + more)


async def test_a_long_session_folds_on_from_its_nearest_stored_state_not_from_its_start(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "long")
    assert len(events) > DIRECT_BATCH  # Longer than one read of the log.
    states = FoldedStates(js, store, every=20, interval_s=0)
    seqs, stored = await append_and_keep_up(store, [states], events)

    reader = FoldedStates(js, store)
    async with replays(nc) as created, session_reads(nc, tenant, "long") as reads:
        latest = await reader.load(tenant, "long", log_first=True)
        middle = await reader.load(tenant, "long", up_to_seq=seqs[300], log_first=True)
        travelled = await reader.load(tenant, "long", up_to_seq=seqs[300])

    assert latest.state == fold(events)
    assert middle.state == travelled.state == fold(events[:301])
    # Each: its first events (not when travelling in time: the stored states come first),
    # then only those after its nearest stored state (fewer than 20, one request), never
    # a replay of the rest through a consumer.
    assert created == []
    assert len(reads) == 2 + 2 + 1
    assert seqs[-1] - stored[-1] < 20


async def test_a_short_session_is_read_in_one_request_without_its_stored_states(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "short")[:120]
    seqs, stored = await append_and_keep_up(
        store, [FoldedStates(js, store, every=20, interval_s=0)], events
    )
    assert len(stored) == 6

    async with (
        index_reads(nc, tenant, "short") as asked,
        session_reads(nc, tenant, "short") as reads,
    ):
        snapshot = await FoldedStates(js, store).load(
            tenant, "short", up_to_seq=seqs[100], log_first=True
        )

    assert snapshot.state == fold(events[:101])
    assert asked == []
    assert len(reads) == 1


async def test_a_cache_miss_on_a_long_session_folds_on_from_its_stored_state(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "missed")
    seqs, _ = await append_and_keep_up(
        store, [FoldedStates(js, store, every=20, interval_s=0)], events
    )
    # A service meets the session for the first time (a restart) late in its life.
    sessions = SessionCache(FoldedStates(js, store))

    async with replays(nc) as created:
        state = await sessions.advance(Delivery(events[-1], seqs[-1], deliveries=1))
        redelivered = await sessions.advance(Delivery(events[-1], seqs[-1], deliveries=2))

    assert state == redelivered == fold(events)
    assert created == []


async def test_an_event_after_a_sessions_end_reads_only_the_events_after_the_last_folded(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    started = new_event(
        SessionStarted(goal="g", requested_by=ANA), tenant=tenant, session_id="ended", source="t"
    )
    events = [
        started,
        started.derive(SessionCompleted(summary="done"), source="t"),
        # The last step's checkpoint, made off the steps' path, after the end.
        started.derive(CheckpointCreated(checkpoint_id="cp", step_id="s", at_seq=1), source="t"),
    ]
    seqs = [(await store.append(event)).seq for event in events]
    sessions = SessionCache(FoldedStates(js, store))
    await sessions.advance(Delivery(events[0], seqs[0], deliveries=1))
    ended = await sessions.advance(Delivery(events[1], seqs[1], deliveries=1))
    assert ended.is_terminal

    async with session_reads(nc, tenant, "ended") as reads:
        late = await sessions.advance(Delivery(events[2], seqs[2], deliveries=1))

    assert [json.loads(read.data)["seq"] for read in reads] == [seqs[1] + 1]
    assert late == fold(events)


async def test_a_sessions_events_advanced_through_together_fold_as_one_by_one(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "together")
    seqs = [(await store.append(event)).seq for event in events]
    deliveries = [Delivery(e, seq, deliveries=1) for e, seq in zip(events, seqs, strict=True)]
    sessions = SessionCache(FoldedStates(js, store))
    await sessions.advance(deliveries[0])
    # The first events again (as after a gathering handed over twice), then the rest.
    state = await sessions.advance_through(deliveries[:3] + deliveries[3:60])
    assert state == fold(events[:60])
    redelivered = Delivery(events[60], seqs[60], deliveries=2)
    state = await sessions.advance_through([redelivered, *deliveries[61:]])
    assert state == fold(events)


async def test_a_start_handed_over_with_later_events_catches_up_on_those_another_replica_had(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    # Replicas share a consumer: this one is handed the start and the fourth event together
    # (gathered), another replica the two between. The state must hold all four.
    events = fifty_steps(tenant, "split")[:4]
    seqs = [(await store.append(event)).seq for event in events]
    handed = [Delivery(events[i], seqs[i], deliveries=1, shared=True) for i in (0, 3)]

    state = await SessionCache(FoldedStates(js, store)).advance_through(handed)

    assert state == fold(events)


async def test_a_full_cache_forgets_the_session_used_longest_ago(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    def started(session_id: str) -> Event:
        return new_event(
            SessionStarted(goal="g", requested_by=ANA),
            tenant=tenant,
            session_id=session_id,
            source="t",
        )

    first, second, third = (started(session_id) for session_id in ("first", "second", "third"))
    later = first.derive(CheckpointCreated(checkpoint_id="cp", step_id="s", at_seq=1), source="t")
    sessions = SessionCache(FoldedStates(js, store), capacity=2)
    for event in (first, second, later, third):
        seq = (await store.append(event)).seq
        await sessions.advance(Delivery(event, seq, deliveries=1))

    # The first session met is still in use; the second, untouched since, made room.
    assert sessions.holds(tenant, "first")
    assert not sessions.holds(tenant, "second")
    assert sessions.holds(tenant, "third")


async def test_replicas_each_fold_what_the_others_were_handed_and_appended(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    # Replicas of a service split its consumer's messages whatever their session: each must
    # still decide on the whole log up to the event it is handed.
    events = fifty_steps(tenant, "shared")
    replicas = [SessionCache(FoldedStates(js, store)) for _ in range(2)]
    handed = Delivery(events[0], (await store.append(events[0])).seq, deliveries=1)
    await replicas[0].advance(handed)
    for index, event in enumerate(events[1:], start=1):
        replica = replicas[index % 3 % 2]  # Unevenly, as a queue group hands them out.
        if index % 5 == 4:
            # The replica's own decision, on the event it was handed last: applied at once,
            # stored, then met in the log.
            replica.record(await replica.advance(handed), [event])
            await store.append(event)
            continue
        handed = Delivery(event, (await store.append(event)).seq, deliveries=1)
        assert await replica.advance(handed) == fold(events[: index + 1]), index


async def test_a_replica_alone_on_its_consumer_reads_no_log_for_an_event_it_is_handed(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "alone")[:6]
    sessions = SessionCache(FoldedStates(js, store))
    seqs = [(await store.append(event)).seq for event in events]
    await sessions.advance(Delivery(events[0], seqs[0], deliveries=1, shared=False))
    async with session_reads(nc, tenant, "alone") as reads:
        for event, seq in zip(events[1:], seqs[1:], strict=True):
            state = await sessions.advance(Delivery(event, seq, deliveries=1, shared=False))
    assert reads == []
    assert state == fold(events)


async def test_log_states_fold_a_session_held_on_by_the_events_appended_since(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "redelivered")
    first, rest = events[:-10], events[-10:]
    seqs, _ = await append_and_keep_up(
        store, [FoldedStates(js, store, every=20, interval_s=0)], first
    )
    log_states = LogStates(store, FoldedStates(js, store))
    # Met on a redelivery: from its nearest stored state and the events after it.
    met = await log_states.now(Delivery(first[5], seqs[5], deliveries=2))
    assert met == fold(first)
    seqs += [(await store.append(event)).seq for event in rest]
    # Held: only what was appended since is read, and no replay of the log streams it.
    async with replays(nc) as created:
        held = await log_states.now(Delivery(first[5], seqs[5], deliveries=2))
    assert held == fold(events)
    assert created == []
