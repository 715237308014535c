"""One example of every event type: documentation for subscribers, checked by the tests.

Each event class declares its example (`Payload.example`); these are derived from them.
"""

from __future__ import annotations

import uuid

from helmline.contracts._envelope import Event, new_event
from helmline.contracts._payload import Payload
from helmline.contracts.events import PAYLOAD_CLASSES
from helmline.contracts.events._samples import AT

EXAMPLE_PAYLOADS: tuple[Payload, ...] = tuple(payload.example() for payload in PAYLOAD_CLASSES)
"""An example payload of every event type, in catalogue order."""


def example_event(payload: Payload) -> Event:
    """The example payload in a complete, stable envelope."""
    return new_event(
        payload,
        tenant="acme",
        session_id="7f3c2a1b9d8e4f60a1b2c3d4e5f60718",
        source="helmline/example",
        at=AT,
        event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"helmline:example:{payload.TYPE}"),
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
