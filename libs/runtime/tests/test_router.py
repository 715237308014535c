"""Handlers declared where they subscribe: held to their consumer both ways, and one policy
for an event type a service does not know."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import generate_latest

from helmline.contracts import (
    DEAD_LETTER_STREAM,
    EVENT_CLASSES,
    EVENTS_STREAM,
    ConsumerSpec,
    Event,
    SessionStarted,
    ThoughtRecorded,
    ToolCallAuthorized,
    ToolCallCompleted,
    dead_letter_subject,
    encode_event,
    event_subject,
    event_type_filter,
    received_payloads,
    session_filter,
)
from helmline.runtime import (
    Delivery,
    EventConsumer,
    EventStore,
    Router,
    RoutingError,
    ServiceMetrics,
    consumer_config,
)
from helmline.runtime.testing import eventually, session_started

NEWER_TYPE = "session.teleported"
"""A type a newer producer might append, which this build does not know."""


def _spec(tenant: str, *event_types: str) -> ConsumerSpec:
    return ConsumerSpec(
        durable=f"routed-{tenant}",
        stream=EVENTS_STREAM.name,
        filter_subjects=tuple(event_type_filter(t, tenant) for t in event_types),
        description="test consumer",
        ack_wait_s=5,
    )


STARTS = _spec("any", SessionStarted.TYPE)


class Starts:
    """A routed handler of session starts, which records them."""

    router = Router(STARTS)

    def __init__(self) -> None:
        self.handled: list[Event] = []

    async def __call__(self, delivery: Delivery) -> None:
        await self.router.dispatch(self, delivery)

    @router.on(SessionStarted)
    async def _started(self, delivery: Delivery) -> None:
        self.handled.append(delivery.event)


def test_a_handler_for_a_type_its_consumer_does_not_receive_fails_on_declaration() -> None:
    router = Router(STARTS)

    async def handle(owner: object, delivery: Delivery) -> None: ...

    with pytest.raises(RoutingError, match=r"does not receive tool\.call\.authorized"):
        router.on(SessionStarted, ToolCallAuthorized)(handle)
    assert router.handled == frozenset()
    router.on(SessionStarted)(handle)
    with pytest.raises(RoutingError, match=r"session\.started handled by two methods"):
        router.on(SessionStarted)


def test_a_consumer_receives_every_type_its_filters_match() -> None:
    calls = received_payloads(_spec("acme", "tool.call.*"))
    assert ToolCallAuthorized in calls
    assert ToolCallCompleted in calls
    assert all(payload.TYPE.startswith("tool.call.") for payload in calls)
    assert received_payloads(_spec("acme", ThoughtRecorded.TYPE)) == (ThoughtRecorded,)
    one_session = ConsumerSpec(
        durable="one",
        stream=EVENTS_STREAM.name,
        filter_subjects=(session_filter("acme", "s1"),),
        description="everything of one session",
    )
    assert len(received_payloads(one_session)) == len(EVENT_CLASSES)


async def test_consuming_a_type_no_method_handles_fails_before_a_message_is_taken(
    nc: NATS, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    started = session_started(tenant, "s1")
    await store.append(started)
    spec = _spec(tenant, SessionStarted.TYPE, ThoughtRecorded.TYPE)

    with pytest.raises(RoutingError, match=rf"routed-{tenant} receives thought\.recorded"):
        EventConsumer(nc, js, spec, Starts())

    # Refused before the durable consumer was even made: nothing was handed out.
    with pytest.raises(nats.js.errors.NotFoundError):
        await js.consumer_info(EVENTS_STREAM.name, spec.durable)


@pytest.fixture
async def starts(
    nc: NATS, js: JetStreamContext, tenant: str
) -> AsyncIterator[tuple[Starts, ServiceMetrics, ConsumerSpec]]:
    """A routed consumer of the tenant's session starts, whose filters also take events of
    a type this build does not know."""
    spec = _spec(tenant, SessionStarted.TYPE, NEWER_TYPE)
    handler, metrics = Starts(), ServiceMetrics("test")
    running = EventConsumer(nc, js, spec, handler, metrics=metrics)
    await running.start()
    yield handler, metrics, spec
    await running.stop(grace_s=1)


async def test_an_event_of_a_type_this_build_does_not_know_is_acknowledged_and_skipped(
    starts: tuple[Starts, ServiceMetrics, ConsumerSpec],
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler, metrics, spec = starts
    started = session_started(tenant, "s1")
    # What a newer producer would append: a valid envelope of a type this build lacks.
    newer = {**json.loads(encode_event(started)), "type": NEWER_TYPE, "data": {"where": "mars"}}
    caplog.set_level(logging.WARNING, logger="helmline.runtime._consumer")
    for number in range(2):
        newer["id"] = f"00000000-0000-4000-8000-00000000000{number}"
        await js.publish(event_subject(tenant, "s1", NEWER_TYPE), json.dumps(newer).encode())
    await store.append(started)

    # The session's next event is not held up behind them.
    await eventually(lambda: handler.handled, what="the session start handled")
    assert handler.handled == [started]
    await eventually(
        lambda: _skipped(metrics, spec, NEWER_TYPE) == 2, what="both newer events counted"
    )
    await _nothing_left_to_deliver(js, spec)
    assert await _dead_letters(js, spec) == 0
    assert _warnings_about(caplog, NEWER_TYPE) == 1


async def test_a_known_type_without_a_method_is_skipped_the_same_way(
    starts: tuple[Starts, ServiceMetrics, ConsumerSpec],
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler, metrics, spec = starts
    # A newer replica sharing the durable consumer widened its filters to a type this
    # replica's handler has no method for (it started checked against its own filters).
    thoughts = event_type_filter(ThoughtRecorded.TYPE, tenant)
    newer_filters = spec.model_copy(update={"filter_subjects": (*spec.filter_subjects, thoughts)})
    await js.add_consumer(EVENTS_STREAM.name, consumer_config(newer_filters))
    caplog.set_level(logging.WARNING, logger="helmline.runtime._consumer")
    started = session_started(tenant, "s1")
    thought = started.derive(ThoughtRecorded(kind="reasoning", text="hm"), source="test")
    await store.append(thought)
    await store.append(started)

    await eventually(lambda: handler.handled, what="the session start handled")
    assert handler.handled == [started]
    await eventually(
        lambda: _skipped(metrics, spec, ThoughtRecorded.TYPE) == 1, what="the thought counted"
    )
    await _nothing_left_to_deliver(js, spec)
    assert await _dead_letters(js, spec) == 0
    assert _warnings_about(caplog, ThoughtRecorded.TYPE) == 1


def _skipped(metrics: ServiceMetrics, spec: ConsumerSpec, event_type: str) -> float:
    value = metrics.registry.get_sample_value(
        "helmline_events_skipped_total", {"consumer": spec.durable, "type": event_type}
    )
    assert "helmline_events_skipped_total" in generate_latest(metrics.registry).decode()
    return value or 0.0


async def _nothing_left_to_deliver(js: JetStreamContext, spec: ConsumerSpec) -> None:
    async def settled() -> bool:
        info = await js.consumer_info(EVENTS_STREAM.name, spec.durable)
        return (info.num_pending, info.num_ack_pending) == (0, 0)

    await eventually(settled, what="every message acknowledged")


async def _dead_letters(js: JetStreamContext, spec: ConsumerSpec) -> int:
    subject = dead_letter_subject(spec.durable)
    info = await js.stream_info(DEAD_LETTER_STREAM.name, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


def _warnings_about(caplog: pytest.LogCaptureFixture, event_type: str) -> int:
    return sum(
        1
        for record in caplog.records
        if record.levelno == logging.WARNING and event_type in record.getMessage()
    )
