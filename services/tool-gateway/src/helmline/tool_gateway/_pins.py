"""Pinned tool definitions: each MCP tool as it was first seen (or last accepted), and the
listing that differs from it, which holds the tool until an operator accepts it.

A server that changes a tool's description, schema or annotations after people came to
trust it (the "rug pull" MCP scanners warn about) no longer has its calls run at once: the
gateway records `tool.definition.changed` and refuses the calls as `tool_changed`, until
`helmline tools accept` records `tool.definition.accepted`, or the server lists the pinned
definition again. The pins are folded from those events on the tools stream, never kept
only in memory: a gateway that starts again, and every replica, holds the same tools.

The tools stream keeps its messages for a while only (`TOOLS_STREAM.max_age_s`), so a pin
(and a change waiting) is recorded again once its newest record is `REFRESH_AFTER` old: it
never expires while a gateway lists its tool, and a held tool is never taken anew.

`evolve`, `decide` and `refusal` are pure; `DefinitionPins` follows the stream, and
`read_pins`, `read_pin` and `accept_definition` serve `helmline tools`, `tools diff` and
`tools accept`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
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
    ToolError,
    UndecodableEvent,
    decode_event,
    new_event,
    tool_definition_subject,
)
from helmline.runtime import EventStore
from helmline.tool_gateway._registry import Listed

logger = logging.getLogger(__name__)

DefinitionEvent = ToolDefinitionPinned | ToolDefinitionChanged | ToolDefinitionAccepted

_PARTS: tuple[DefinitionPart, ...] = get_args(DefinitionPart)

REFRESH_AFTER = timedelta(seconds=(TOOLS_STREAM.max_age_s or 0) / 4)
"""A pin or a change recorded this long ago is recorded again (a quarter of the tools
stream's retention: a gateway down for most of it still finds its pins)."""


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


def evolve(
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


def decide(
    pins: Mapping[str, Pin], server: str, listed: Mapping[str, Listed], now: datetime
) -> list[ToolDefinitionPinned | ToolDefinitionChanged]:
    """What a server's listing (its tools by registry name) adds to the record: a pin for
    each tool seen for the first time, a change for each that differs from its pin unless
    that very change is already recorded, and again each pin and change recorded
    `REFRESH_AFTER` ago or more."""
    decided: list[ToolDefinitionPinned | ToolDefinitionChanged] = []
    for tool, now_listed in listed.items():
        pin = pins.get(tool)
        if pin is None or _due(pin.pinned_at, now):
            definition = now_listed if pin is None else Listed(pin.definition, pin.digest)
            decided.append(
                ToolDefinitionPinned(
                    tool=tool,
                    server=server,
                    digest=definition.digest,
                    definition=definition.definition,
                )
            )
        if pin is None:
            continue
        if pin.change is not None and _due(pin.changed_at, now):
            decided.append(pin.change)
        elif pin.holds(now_listed.digest) and (
            pin.change is None or pin.change.digest != now_listed.digest
        ):
            decided.append(
                ToolDefinitionChanged(
                    tool=tool,
                    server=server,
                    pinned_digest=pin.digest,
                    digest=now_listed.digest,
                    changed=changed_parts(pin.definition, now_listed.definition),
                    pinned=pin.definition,
                    definition=now_listed.definition,
                )
            )
    return decided


def _due(recorded_at: datetime | None, now: datetime) -> bool:
    """Whether a record is old enough to be recorded again (one whose time the stream no
    longer has is)."""
    return recorded_at is None or now - recorded_at >= REFRESH_AFTER


def event_id(
    event: ToolDefinitionPinned | ToolDefinitionChanged, pins: Mapping[str, Pin]
) -> uuid.UUID:
    """The same for the same decision, by whichever replica makes it (the stream keeps one):
    a pin by its definition; a change by the pin's last event and the new definition."""
    pin = pins.get(event.tool)
    return uuid.uuid5(
        _NAMESPACE, f"{event.TYPE}/{event.tool}/{pin.seq if pin else 0}/{event.digest}"
    )


def refusal(
    pin: Pin | None, listed: Listed | None, authorized_for: str | None = None
) -> ToolError | None:
    """Why a call of the tool is refused: its server lists it otherwise than pinned, or
    otherwise than when the call was decided on (`authorized_for`: the digest the decision
    named, the grant a person made being for that definition only)."""
    if listed is None:
        return None
    if pin is not None and pin.holds(listed.digest):
        changed = changed_parts(pin.definition, listed.definition)
        parts = ", ".join(part.replace("_", " ") for part in changed)
        return ToolError(
            kind="tool_changed",
            message=f"{pin.tool} is listed by its server otherwise than pinned ({parts} "
            "changed): its calls are held until an operator accepts the change",
            suggestion=f"an operator reviews it with `helmline tools diff {pin.tool}` and "
            f"accepts it with `helmline tools accept {pin.tool}`; meanwhile do without it",
        )
    if authorized_for is not None and listed.digest != authorized_for:
        return ToolError(
            kind="tool_changed",
            message="the tool's definition changed after the call was decided on: the "
            "decision (and any person's grant) was for the definition before",
            retryable=False,
            suggestion="propose the call again, to have it decided for the definition in force",
        )
    return None


_NAMESPACE = uuid.UUID("5b0b6f0e-8d1c-4f49-9a43-2f5d7c1e0a91")


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
                    self.pins = evolve(self.pins, event.data, seq, event.time)
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
    accepted_id = uuid.uuid5(_NAMESPACE, f"{accepted.TYPE}/{tool}/{pin.seq}/{accepted.digest}")
    event = new_event(
        accepted,
        tenant=TOOLS_TENANT,
        session_id=TOOLS_SESSION,
        source=source,
        event_id=accepted_id,
    )
    await store.publish(tool_definition_subject(tool), event)
    return accepted
