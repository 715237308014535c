"""Operational notices about the streams themselves (on the ops stream, not in a session's log)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Self

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import STATE
from helmline.contracts.events._samples import AT


class StreamLimitApproaching(Payload, type="stream.limit_approaching", published_by=(STATE,)):
    """A stream holds at least the warning share of one of its limits (age or bytes): its
    oldest events will soon be removed. Export what must be kept first (`helmline export`)."""

    stream: str = Field(min_length=1, max_length=64)
    """The JetStream stream, e.g. HELMLINE_EVENTS."""
    limit: Literal["age", "bytes"]
    """Which limit: how long events are kept, or how many bytes the stream may hold."""
    used: float = Field(ge=0)
    """The share of the limit in use: 0.8 is 80 %."""
    limit_value: float = Field(gt=0)
    """The limit: seconds for age, bytes for bytes."""
    current_value: float = Field(ge=0)
    """Where the stream stands: the age of its oldest event in seconds, or its bytes."""
    oldest_at: datetime | None = None
    """When the oldest event still in the stream was stored."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            stream="HELMLINE_EVENTS",
            limit="bytes",
            used=0.83,
            limit_value=10 * 1024**3,
            current_value=0.83 * 10 * 1024**3,
            oldest_at=AT,
        )
