"""Durable consumers: poison messages are dead-lettered, failures redelivered, order kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import generate_latest

from helmline.contracts import (
    EVENTS_STREAM,
    ConsumerSpec,
    DeadLetter,
    Event,
    SessionStarted,
    ThoughtRecorded,
    dead_letter_subject,
    encode_event,
    event_subject,
    tenant_filter,
)
from helmline.runtime import (
    Deferred,
    Delivery,
    EventConsumer,
    EventStore,
    FoldedStates,
    PermanentError,
    RetryableError,
    ServiceMetrics,
    SessionCache,
)
from helmline.runtime.testing import eventually, session_started


def _spec(tenant: str, max_deliver: int = 3) -> ConsumerSpec:
    return ConsumerSpec(
        durable=f"test-{tenant}",
        stream=EVENTS_STREAM.name,
        filter_subjects=(tenant_filter(tenant),),
        description="test consumer",
        max_deliver=max_deliver,
        ack_wait_s=5,
    )


def _thought(cause: Event, text: str) -> Event:
    return cause.derive(ThoughtRecorded(kind="reasoning", text=text), source="test", key=text)


class Recorder:
    """A handler that records what it handled and fails where told to."""

    def __init__(self) -> None:
        self.handled: list[Delivery] = []
        self.fail: dict[str, type[Exception]] = {}
        self.fail_times: dict[str, int] = {}

    async def __call__(self, delivery: Delivery) -> None:
        data = delivery.event.data
        text = data.text if isinstance(data, ThoughtRecorded) else ""
        if text in self.fail and self.fail_times.get(text, 1) > 0:
            self.fail_times[text] = self.fail_times.get(text, 1) - 1
            raise self.fail[text](f"told to fail on {text}")
        self.handled.append(delivery)

    def texts(self) -> list[str]:
        return [
            d.event.data.text for d in self.handled if isinstance(d.event.data, ThoughtRecorded)
        ]


@pytest.fixture
async def consumer(
    nc: NATS, js: JetStreamContext, tenant: str
) -> AsyncIterator[tuple[EventConsumer, Recorder]]:
    recorder = Recorder()
    running = EventConsumer(nc, js, _spec(tenant), recorder)
    await running.start()
    yield running, recorder
    await running.stop(grace_s=1)


async def _dead_letters(js: JetStreamContext, tenant: str, count: int) -> list[DeadLetter]:
    letters: list[DeadLetter] = []
    got_all = asyncio.Event()

    async def collect(message: object) -> None:
        letters.append(DeadLetter.model_validate_json(message.data))  # type: ignore[attr-defined]
        if len(letters) >= count:
            got_all.set()

    subscription = await js.subscribe(
        dead_letter_subject(f"test-{tenant}"), ordered_consumer=True, cb=collect
    )
    try:
        await asyncio.wait_for(got_all.wait(), timeout=10)
    finally:
        await subscription.unsubscribe()
    return letters


async def test_poison_messages_are_dead_lettered_and_the_next_event_is_processed(
    consumer: tuple[EventConsumer, Recorder],
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
) -> None:
    _, recorder = consumer
    started = session_started(tenant, "s1")
    wrong_version = json.loads(encode_event(started))
    wrong_version["schemaversion"] = 99
    subject = event_subject(tenant, "s1", "session.started")
    await js.publish(subject, b"{this is not json")
    # An event whose type is not its subject's (a known one): garbage, not a newer type.
    await js.publish(
        subject,
        json.dumps({**wrong_version, "type": "session.exploded", "schemaversion": 1}).encode(),
    )
    await js.publish(subject, json.dumps(wrong_version).encode())
    await store.append(started)

    await eventually(lambda: recorder.handled, what="the valid event handled")
    assert [d.event for d in recorder.handled] == [started]
    letters = await _dead_letters(js, tenant, 3)
    reasons = [letter.reason for letter in letters]
    assert "not valid JSON" in reasons[0]
    assert "unknown event type 'session.exploded'" in reasons[1]
    assert "schema version 99 is newer" in reasons[2]
    assert letters[0].payload == "{this is not json"
    assert all(letter.consumer == f"test-{tenant}" for letter in letters)


async def test_retryable_failures_are_redelivered_then_succeed(
    consumer: tuple[EventConsumer, Recorder], store: EventStore, tenant: str
) -> None:
    _, recorder = consumer
    recorder.fail["flaky"] = RetryableError
    recorder.fail_times["flaky"] = 2
    started = session_started(tenant, "s1")
    await store.append(_thought(started, "flaky"))

    await eventually(lambda: recorder.texts() == ["flaky"], what="flaky handled")
    assert recorder.handled[0].deliveries == 3


async def test_a_deferred_message_comes_again_at_its_time_while_the_session_goes_on(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    deferred_at: list[datetime] = []
    handled: list[tuple[str, int, datetime]] = []

    async def handler(delivery: Delivery) -> None:
        data = delivery.event.data
        text = data.text if isinstance(data, ThoughtRecorded) else ""
        now = datetime.now(UTC)
        if text == "later" and delivery.deliveries == 1:
            deferred_at.append(now)
            raise Deferred(now + timedelta(seconds=1), "not yet")
        handled.append((text, delivery.deliveries, now))

    # Two deliveries at most: the deferral spends one, the second acts on the message.
    running = EventConsumer(nc, js, _spec(tenant, max_deliver=2), handler)
    await running.start()
    try:
        started = session_started(tenant, "s1")
        await store.append_all([_thought(started, "later"), _thought(started, "next")])
        await eventually(lambda: len(handled) == 2, timeout_s=10, what="both handled")
    finally:
        await running.stop(grace_s=1)

    (first, _, _), (second, deliveries, at) = handled
    assert (first, second) == ("next", "later")
    assert deliveries == 2
    assert at - deferred_at[0] >= timedelta(seconds=0.9)


async def test_permanent_failures_and_exhausted_retries_are_dead_lettered(
    consumer: tuple[EventConsumer, Recorder],
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
) -> None:
    _, recorder = consumer
    recorder.fail["doomed"] = PermanentError
    recorder.fail["broken"] = RuntimeError
    recorder.fail_times["broken"] = 99
    started = session_started(tenant, "s1")
    await store.append(_thought(started, "doomed"))
    await store.append(_thought(session_started(tenant, "s2"), "broken"))
    await store.append(_thought(started, "fine"))

    letters = await _dead_letters(js, tenant, 2)
    reasons = sorted(letter.reason for letter in letters)
    assert reasons[0].startswith("gave up after 3 deliveries: RuntimeError")
    assert reasons[1] == "permanent error: told to fail on doomed"
    await eventually(lambda: "fine" in recorder.texts(), what="the next event handled")


async def test_one_session_is_handled_in_order(
    consumer: tuple[EventConsumer, Recorder], store: EventStore, tenant: str
) -> None:
    _, recorder = consumer
    started = session_started(tenant, "s1")
    texts = [f"n{i}" for i in range(50)]
    await store.append_all([_thought(started, text) for text in texts])
    await eventually(lambda: len(recorder.texts()) == 50, what="all handled")
    assert recorder.texts() == texts


async def test_a_replica_knows_when_it_shares_its_consumer_with_another(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    alone = Recorder()
    first = EventConsumer(nc, js, _spec(tenant), alone)
    await first.start()
    started = session_started(tenant, "s1")
    await store.append_all([_thought(started, f"a{i}") for i in range(10)])
    await eventually(lambda: len(alone.texts()) == 10, what="all handled by the first")
    assert not any(delivery.shared for delivery in alone.handled)

    joined = Recorder()
    second = EventConsumer(nc, js, _spec(tenant), joined)
    await second.start()
    try:
        await store.append_all([_thought(started, f"b{i}") for i in range(40)])
        await eventually(
            lambda: len(alone.texts()) + len(joined.texts()) == 50, what="all handled by the two"
        )
    finally:
        await second.stop(grace_s=1)
        await first.stop(grace_s=1)
    # Each was handed some (a queue group splits them); each then learnt it is not alone.
    assert joined.handled
    assert len(alone.texts()) > 10
    assert alone.handled[-1].shared
    assert joined.handled[-1].shared


class Gatherer(Recorder):
    """Lets thoughts starting with "late" gather; records each gathering handed over."""

    def __init__(self) -> None:
        super().__init__()
        self.gatherings: list[list[str]] = []
        self.fail_gathering = False

    def may_wait(self, event: Event) -> bool:
        return isinstance(event.data, ThoughtRecorded) and event.data.text.startswith("late")

    async def handle_gathered(self, deliveries: Sequence[Delivery]) -> None:
        texts = [d.event.data.text for d in deliveries if isinstance(d.event.data, ThoughtRecorded)]
        self.gatherings.append(texts)
        if self.fail_gathering:
            raise RuntimeError("told to fail the gathering")
        self.handled += deliveries


@pytest.fixture
async def gathering(
    nc: NATS, js: JetStreamContext, tenant: str
) -> AsyncIterator[tuple[EventConsumer, Gatherer]]:
    gatherer = Gatherer()
    spec = _spec(tenant).model_copy(update={"gather_s": 0.2})
    running = EventConsumer(nc, js, spec, gatherer)
    await running.start()
    yield running, gatherer
    await running.stop(grace_s=1)


async def test_events_that_may_wait_are_handed_over_together_in_order_and_acknowledged(
    gathering: tuple[EventConsumer, Gatherer], store: EventStore, js: JetStreamContext, tenant: str
) -> None:
    _, gatherer = gathering
    one, two = session_started(tenant, "s1"), session_started(tenant, "s2")
    texts = [f"late-{i}" for i in range(20)]
    await store.append_all([_thought(one, text) for text in texts[:10]])
    await store.append_all([_thought(two, text) for text in texts[10:]])
    await eventually(lambda: len(gatherer.texts()) == 20, what="all handled")
    assert gatherer.gatherings == [texts]

    async def all_acknowledged() -> bool:
        info = await js.consumer_info(EVENTS_STREAM.name, f"test-{tenant}")
        return bool(info.num_ack_pending == 0)

    # Well within the 5 s ack_wait: not acknowledged, they would still be pending.
    await eventually(all_acknowledged, what="every event acknowledged", timeout_s=3)


async def test_an_event_that_may_not_wait_comes_after_those_gathered_before_it(
    gathering: tuple[EventConsumer, Gatherer], store: EventStore, tenant: str
) -> None:
    _, gatherer = gathering
    started = session_started(tenant, "s1")
    texts = ["late-a", "late-b", "now", "late-c"]
    await store.append_all([_thought(started, text) for text in texts])
    await eventually(lambda: len(gatherer.texts()) == 4, what="all handled")
    # "now" did not wait the 0.2 s, but was handled after the two gathered before it.
    assert gatherer.texts() == texts
    assert gatherer.gatherings == [["late-a", "late-b"], ["late-c"]]


async def test_a_gathering_that_fails_is_handled_event_by_event(
    gathering: tuple[EventConsumer, Gatherer], store: EventStore, tenant: str
) -> None:
    _, gatherer = gathering
    gatherer.fail_gathering = True
    gatherer.fail = {"late-b": RetryableError}
    started = session_started(tenant, "s1")
    await store.append_all([_thought(started, text) for text in ("late-a", "late-b")])
    # Alone, "late-b" fails once and is delivered again: each event's own fate.
    await eventually(lambda: sorted(gatherer.texts()) == ["late-a", "late-b"], what="handled")
    assert gatherer.gatherings[0] == ["late-a", "late-b"]


async def test_a_handled_event_shows_where_its_hop_spent_its_time(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    sessions = SessionCache(FoldedStates(js, store))
    answered: list[Event] = []

    async def handler(delivery: Delivery) -> None:
        event = delivery.event
        if isinstance(event.data, SessionStarted) or event.source == "handler":
            return
        # Met after its start, the session is read from the log, folded, then added to.
        state = await sessions.advance(delivery)
        answer = event.derive(ThoughtRecorded(kind="reasoning", text="ok"), source="handler")
        await store.append(answer)
        sessions.record(state, [answer])
        answered.append(answer)

    metrics = ServiceMetrics("test")
    spec = _spec(tenant)
    running = EventConsumer(nc, js, spec, handler, metrics=metrics)
    await running.start()
    try:
        started = session_started(tenant, "s1")
        await store.append_all([started, _thought(started, "hello")])
        await eventually(lambda: answered, what="the thought answered")
        # The answer comes back to the consumer too: three hops in all.
        await eventually(
            lambda: _hop_phases(metrics, spec.durable).get(("ack", "count")) == 3,
            what="three hops recorded",
        )
    finally:
        await running.stop(grace_s=1)

    phases = _hop_phases(metrics, spec.durable)
    names = ("wait", "queue", "decode", "admit", "read", "fold", "decide", "encode", "append")
    assert {phases[(name, "count")] for name in names} == {3}
    # Only the thought's hop read, folded and appended; every hop waited, decoded and acked.
    for name in ("wait", "decode", "read", "fold", "decide", "encode", "append", "ack"):
        assert phases[(name, "sum")] > 0, name


def _hop_phases(metrics: ServiceMetrics, consumer: str) -> dict[tuple[str, str], float]:
    """`helmline_hop_phase_seconds` of a consumer: (phase, "count" or "sum") to its value."""
    found: dict[tuple[str, str], float] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        for kind in ("count", "sum"):
            prefix = f"helmline_hop_phase_seconds_{kind}{{"
            if line.startswith(prefix) and f'consumer="{consumer}"' in line:
                phase = line.split('phase="')[1].split('"')[0]
                found[(phase, kind)] = float(line.rsplit(" ", 1)[1])
    return found
