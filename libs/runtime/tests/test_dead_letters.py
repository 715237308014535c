"""Operators list, retry and discard dead letters; a retry runs the code deployed since."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from helmline.contracts import (
    EVENTS_STREAM,
    PAYLOAD_CLASSES,
    ConsumerSpec,
    ThoughtRecorded,
    UpcasterRegistry,
    encode_event,
    event_subject,
    tenant_filter,
)
from helmline.runtime import DeadLetterBox, Delivery, EventConsumer
from helmline.runtime.testing import eventually, session_started


def _old_thought(tenant: str) -> bytes:
    """A thought.recorded stored by an old build, at schema version 1."""
    started = session_started(tenant, "s1")
    document = json.loads(
        encode_event(started.derive(ThoughtRecorded(kind="decision", text="use wc"), source="test"))
    )
    document["schemaversion"] = 1
    document["data"]["alternatives"] = ["count in Python"]
    return json.dumps(document).encode()


class Received:
    def __init__(self) -> None:
        self.events: list[Delivery] = []

    async def __call__(self, delivery: Delivery) -> None:
        self.events.append(delivery)


@pytest.fixture
async def consumer(
    nc: NATS, js: JetStreamContext, tenant: str
) -> AsyncIterator[tuple[UpcasterRegistry, Received, str]]:
    # A build that knows thought.recorded version 2 but has no upcaster from version 1 yet.
    registry = UpcasterRegistry({p.TYPE: p.SCHEMA_VERSION for p in PAYLOAD_CLASSES})
    received = Received()
    spec = ConsumerSpec(
        durable=f"dlq-{tenant}",
        stream=EVENTS_STREAM.name,
        filter_subjects=(tenant_filter(tenant),),
        description="test",
    )
    running = EventConsumer(nc, js, spec, received, registry)
    await running.start()
    yield registry, received, spec.durable
    await running.stop(grace_s=1)


async def test_a_letter_without_its_upcaster_is_handled_after_the_upcaster_arrives(
    consumer: tuple[UpcasterRegistry, Received, str],
    nc: NATS,
    js: JetStreamContext,
    tenant: str,
) -> None:
    registry, received, durable = consumer
    box = DeadLetterBox(nc, js)
    await js.publish(event_subject(tenant, "s1", ThoughtRecorded.TYPE), _old_thought(tenant))

    (parked,) = await eventually(lambda: box.letters(durable), what="the letter parked")
    assert "schema version 1 has no upcaster to 2" in parked.letter.reason
    refused = await box.retry(parked.seq)
    assert not refused.ok
    assert "no upcaster" in refused.reason
    assert [p.seq for p in await box.letters(durable)] == [parked.seq]

    @registry.register(ThoughtRecorded.TYPE, from_version=1)
    def with_reasons(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "alternatives": [{"option": o} for o in data["alternatives"]]}

    handled = await box.retry(parked.seq)
    assert handled.ok, handled.reason
    (delivery,) = received.events
    assert isinstance(delivery.event.data, ThoughtRecorded)
    assert delivery.event.data.alternatives[0].option == "count in Python"
    # Handed over as a redelivery: handlers check the log before acting again.
    assert delivery.deliveries == parked.letter.deliveries + 1
    assert await box.letters(durable) == []


async def test_a_letter_can_be_discarded(
    consumer: tuple[UpcasterRegistry, Received, str],
    nc: NATS,
    js: JetStreamContext,
    tenant: str,
) -> None:
    _, _, durable = consumer
    box = DeadLetterBox(nc, js)
    await js.publish(event_subject(tenant, "s1", "session.started"), b"{not json")
    (parked,) = await eventually(lambda: box.letters(durable), what="the letter parked")
    assert (await box.letter(parked.seq)).letter.payload == "{not json"

    await box.discard(parked.seq)

    assert await box.letters(durable) == []
