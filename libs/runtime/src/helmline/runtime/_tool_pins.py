"""Pinned tool definitions as the tools stream records them: each MCP tool as it was first
seen (or last accepted), and the listing that differs from it, which holds the tool until an
operator accepts it (`tool.definition.pinned`, `.changed`, `.accepted`).

The pins are folded from those events, never kept only in memory: every gateway replica, the
API and the CLI read the same ones. `evolve_pins` is the pure fold; `DefinitionPins` follows the
stream; `read_pins`, `read_pin` and `accept_definition` serve `helmline tools`, `tools diff`,
`tools accept` and the API's MCP routes. What a listing adds to the record, and why a call
is refused, are the gateway's to decide.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import get_args

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from helmline.contracts import (
    ALL_TOOL_DEFINITIONS,
    TOOLS_SESSION,
    TOOLS_STREAM,
    TOOLS_TENANT,
    Actor,
    DefinitionPart,
    ToolDefinition,
    ToolDefinitionAccepted,
    ToolDefinitionChanged,
    ToolDefinitionPinned,
    UndecodableEvent,
    decode_event,
    new_event,
    tool_definition_subject,
)
from helmline.runtime._store import EventStore

logger = logging.getLogger(__name__)

DefinitionEvent = ToolDefinitionPinned | ToolDefinitionChanged | ToolDefinitionAccepted

_PARTS: tuple[DefinitionPart, ...] = get_args(DefinitionPart)


@dataclass(frozen=True, slots=True)
class Pin:
    """One tool's pinned definition, and the listing that differs from it, if any."""

    tool: str
    """The tool, as the registry names it."""
    server: str
    """Its MCP server."""
    definition: ToolDefinition
    """The definition in force: the one first seen, or the one last accepted."""
    digest: str
    """Its digest, as recorded."""
    change: ToolDefinitionChanged | None = None
    """The latest listing that differs from `definition`, not accepted (yet)."""
    seq: int = 0
    """The stream sequence of the last event folded into the pin."""
    pinned_at: datetime | None = None
    """When `definition` was last recorded (pinned, accepted, or pinned again)."""
    changed_at: datetime | None = None
    """When `change` was last recorded."""

    def holds(self, listed_digest: str) -> bool:
        """Whether a listing of this digest holds the tool: it differs from the pin."""
        return listed_digest != self.digest


def changed_parts(before: ToolDefinition, after: ToolDefinition) -> tuple[DefinitionPart, ...]:
    """The parts of a definition that differ."""
    return tuple(part for part in _PARTS if getattr(before, part) != getattr(after, part))


def evolve_pins(
    pins: Mapping[str, Pin], event: DefinitionEvent, seq: int, at: datetime
) -> Mapping[str, Pin]:
    """The pins once `event` (stored at `seq`, at `at`) is folded in."""
    pin = pins.get(event.tool)
    match event:
        case ToolDefinitionPinned() if pin is None:
            pin = Pin(event.tool, event.server, event.definition, event.digest, seq=seq)
            pin = replace(pin, pinned_at=at)
        case ToolDefinitionPinned() if pin is not None and event.digest == pin.digest:
            pin = replace(pin, seq=seq, pinned_at=at)  # Recorded again, before it expires.
        case ToolDefinitionPinned():
            return pins  # The first pin stands (another replica's came later).
        case ToolDefinitionChanged() if pin is not None and event.digest == pin.digest:
            return pins  # Decided before its replica heard the change was accepted.
        case ToolDefinitionChanged():
            # Without a pin (its events expired from the stream) the change still says what
            # was in force.
            if pin is None:
                pin = Pin(event.tool, event.server, event.pinned, event.pinned_digest)
            pin = replace(pin, change=event, seq=seq, changed_at=at)
        case ToolDefinitionAccepted() if (
            pin is not None and pin.change is not None and pin.change.digest == event.digest
        ):
            definition = pin.change.definition
            pin = replace(pin, definition=definition, digest=event.digest, change=None, seq=seq)
            pin = replace(pin, pinned_at=at, changed_at=None)
        case ToolDefinitionAccepted():
            return pins  # Not the change waiting: a newer one came since, or none waits.
    return {**pins, event.tool: pin}


DEFINITIONS_NAMESPACE = uuid.UUID("5b0b6f0e-8d1c-4f49-9a43-2f5d7c1e0a91")
"""Derives the ids of definition events, so that every replica deciding the same one
stores it once."""


class DefinitionPins:
    """The pins as the tools stream records them, kept current while following it."""

    def __init__(self) -> None:
        self.pins: Mapping[str, Pin] = {}
        self._subscription: Subscription | None = None

    async def follow(
        self, js: JetStreamContext, subject: str = ALL_TOOL_DEFINITIONS, timeout_s: float = 30.0
    ) -> None:
        """Fold every stored definition event (of `subject`), then each one published from
        now on; returns once the stored ones are folded."""
        try:
            last = (await js.get_last_msg(TOOLS_STREAM.name, subject)).seq or 0
        except NotFoundError:
            last = 0
        caught_up = asyncio.Event()
        if last == 0:
            caught_up.set()

        async def folded(message: Msg) -> None:
            seq = message.metadata.sequence.stream
            try:
                event = decode_event(message.data)
            except UndecodableEvent as error:
                logger.warning("ignoring an undecodable tool definition event: %s", error)
            else:
                if isinstance(event.data, DefinitionEvent):
                    self.pins = evolve_pins(self.pins, event.data, seq, event.time)
            if seq >= last:
                caught_up.set()

        self._subscription = await js.subscribe(
            subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL, cb=folded
        )
        await asyncio.wait_for(caught_up.wait(), timeout_s)

    async def close(self) -> None:
        """Stop following."""
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None


class DefinitionError(Exception):
    """There is nothing to accept: the tool has no pin, or no change waits."""


async def read_pins(js: JetStreamContext, subject: str = ALL_TOOL_DEFINITIONS) -> Mapping[str, Pin]:
    """The pins as the stream records them now (of the tools `subject` covers)."""
    pins = DefinitionPins()
    try:
        await pins.follow(js, subject)
    finally:
        await pins.close()
    return pins.pins


async def read_pin(js: JetStreamContext, tool: str) -> Pin | None:
    """A tool's pin as the stream records it now; None if none was recorded."""
    return (await read_pins(js, tool_definition_subject(tool))).get(tool)


async def accept_definition(
    store: EventStore, tool: str, *, by: Actor, source: str, reason: str = ""
) -> ToolDefinitionAccepted:
    """Record that `by` accepts the definition of `tool` that waits (appended as from
    `source`); raises `DefinitionError` when none waits."""
    pin = await read_pin(store.js, tool)
    if pin is None:
        raise DefinitionError(f"no definition of {tool} is pinned: no gateway has listed it")
    if pin.change is None:
        raise DefinitionError(f"{tool} is listed as pinned: no change waits for acceptance")
    accepted = ToolDefinitionAccepted(
        tool=tool,
        digest=pin.change.digest,
        previous_digest=pin.digest,
        accepted_by=by,
        reason=reason,
    )
    accepted_id = uuid.uuid5(
        DEFINITIONS_NAMESPACE, f"{accepted.TYPE}/{tool}/{pin.seq}/{accepted.digest}"
    )
    event = new_event(
        accepted,
        tenant=TOOLS_TENANT,
        session_id=TOOLS_SESSION,
        source=source,
        event_id=accepted_id,
    )
    await store.publish(tool_definition_subject(tool), event)
    return accepted


def definition_diff(change: ToolDefinitionChanged) -> str:
    """A changed definition for people: the digests, then each changed part as a unified
    diff from the pinned definition to the listed one."""
    lines = [
        f"{change.tool} is held: its server lists it otherwise than pinned",
        f"pinned {change.pinned_digest}",
        f"listed {change.digest}",
        f"changed: {', '.join(change.changed)}",
    ]
    for part in change.changed:
        lines += difflib.unified_diff(
            _lines(getattr(change.pinned, part)),
            _lines(getattr(change.definition, part)),
            f"pinned {part}",
            f"listed {part}",
            lineterm="",
        )
    return "\n".join(lines)


def _lines(value: object) -> list[str]:
    text = value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True)
    return text.splitlines()
