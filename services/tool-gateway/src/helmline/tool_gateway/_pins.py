"""Pinned tool definitions, the gateway's part: what a server's listing adds to the record,
and why a call of a tool is refused.

A server that changes a tool's description, schema or annotations after people came to
trust it (the "rug pull" MCP scanners warn about) no longer has its calls run at once: the
gateway records `tool.definition.changed` and refuses the calls as `tool_changed`, until
`helmline tools accept` (or the API) records `tool.definition.accepted`, or the server lists
the pinned definition again. The pins themselves are folded from those events on the tools
stream (`helmline.runtime.DefinitionPins`): a gateway that starts again, every replica, the
API and the CLI hold the same ones.

The tools stream keeps its messages for a while only (`TOOLS_STREAM.max_age_s`), so a pin
(and a change waiting) is recorded again once its newest record is `REFRESH_AFTER` old: it
never expires while a gateway lists its tool, and a held tool is never taken anew.

`decide`, `event_id` and `refusal` are pure.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta

from helmline.contracts import (
    TOOLS_STREAM,
    ToolDefinitionChanged,
    ToolDefinitionPinned,
    ToolError,
)
from helmline.runtime import DEFINITIONS_NAMESPACE, Pin, changed_parts
from helmline.tool_gateway._registry import Listed

REFRESH_AFTER = timedelta(seconds=(TOOLS_STREAM.max_age_s or 0) / 4)
"""A pin or a change recorded this long ago is recorded again (a quarter of the tools
stream's retention: a gateway down for most of it still finds its pins)."""


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
        DEFINITIONS_NAMESPACE, f"{event.TYPE}/{event.tool}/{pin.seq if pin else 0}/{event.digest}"
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
