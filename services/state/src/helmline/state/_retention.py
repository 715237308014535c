"""Watching the events stream's retention limits: a warning before events are removed."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Literal

import nats.errors
from nats.js import JetStreamContext

from helmline.contracts import (
    EVENTS_STREAM,
    OPS_SESSION,
    OPS_TENANT,
    RETENTION_SUBJECT,
    StreamLimitApproaching,
    new_event,
    source_of,
)
from helmline.runtime import EventStore, ServiceMetrics

SOURCE = source_of("state")
STEPS = 20
"""Once past the warning share, a further warning for every further 1/STEPS (5 %) used."""

logger = logging.getLogger(__name__)


def limits_in_use(
    *,
    max_age_s: float | None,
    max_bytes: int | None,
    stored_bytes: int,
    oldest_at: datetime | None,
    now: datetime,
) -> list[StreamLimitApproaching]:
    """How much of each limit the events stream has set is in use (the same figures that
    are published once past the warning share). Pure."""

    def reading(
        limit: Literal["age", "bytes"], value: float, current: float
    ) -> StreamLimitApproaching:
        return StreamLimitApproaching(
            stream=EVENTS_STREAM.name,
            limit=limit,
            used=round(current / value, 4),
            limit_value=value,
            current_value=current,
            oldest_at=oldest_at,
        )

    readings = []
    if max_bytes:
        readings.append(reading("bytes", max_bytes, stored_bytes))
    if max_age_s:
        age_s = max(0.0, (now - oldest_at).total_seconds()) if oldest_at else 0.0
        readings.append(reading("age", max_age_s, age_s))
    return readings


class RetentionWatch:
    """Checks the events stream every `interval_s`: the share of each limit in use goes to
    the `stream_limit_used_ratio` metric, and `stream.limit_approaching` is published on the
    ops stream when a limit is `warn_at` used, then again at each further 5 %."""

    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        metrics: ServiceMetrics,
        *,
        warn_at: float,
        interval_s: float,
    ) -> None:
        self._js = js
        self._store = store
        self._metrics = metrics
        self._warn_at = warn_at
        self._interval_s = interval_s
        self._warned: dict[str, int] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except (nats.errors.Error, TimeoutError) as error:
                # NATS is away for a moment; the next check will see the stream again.
                logger.warning("could not check the events stream's limits: %r", error)
            await asyncio.sleep(self._interval_s)

    async def check(self) -> None:
        info = await self._js.stream_info(EVENTS_STREAM.name)
        oldest_at = None
        if info.state.messages:
            first = await self._js.get_msg(EVENTS_STREAM.name, seq=info.state.first_seq)
            oldest_at = first.time
        readings = limits_in_use(
            max_age_s=info.config.max_age or None,
            max_bytes=info.config.max_bytes if (info.config.max_bytes or 0) > 0 else None,
            stored_bytes=info.state.bytes,
            oldest_at=oldest_at,
            now=datetime.now(UTC),
        )
        for reading in readings:
            self._metrics.stream_limit_used.labels(reading.stream, reading.limit).set(reading.used)
        warnings = [reading for reading in readings if reading.used >= self._warn_at]
        for limit in self._warned.keys() - {warning.limit for warning in warnings}:
            del self._warned[limit]  # Back under the warning share: warn afresh next time.
        for warning in warnings:
            step = int(warning.used * STEPS)
            if step <= self._warned.get(warning.limit, -1):
                continue
            self._warned[warning.limit] = step
            logger.warning(
                "the events stream has used %.0f %% of its %s limit: export what must be kept",
                warning.used * 100,
                warning.limit,
            )
            event = new_event(warning, tenant=OPS_TENANT, session_id=OPS_SESSION, source=SOURCE)
            await self._store.publish(RETENTION_SUBJECT, event)
