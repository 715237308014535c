"""Watching the events stream's retention limits: a warning before events are removed."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import nats.errors
from nats.js import JetStreamContext

from helmline.contracts import (
    EVENTS_STREAM,
    OPS_SESSION,
    OPS_TENANT,
    RETENTION_SUBJECT,
    Headers,
    StreamLimitApproaching,
    encode_event,
    new_event,
)

SOURCE = "helmline/state"
STEPS = 20
"""Once past the warning share, a further warning for every further 1/STEPS (5 %) used."""

logger = logging.getLogger(__name__)


def approaching(
    *,
    max_age_s: float | None,
    max_bytes: int | None,
    stored_bytes: int,
    oldest_at: datetime | None,
    now: datetime,
    warn_at: float,
) -> list[StreamLimitApproaching]:
    """A warning for each limit of the events stream that is at least `warn_at` used. Pure."""
    warnings = []
    if max_bytes:
        used = stored_bytes / max_bytes
        if used >= warn_at:
            warnings.append(
                StreamLimitApproaching(
                    stream=EVENTS_STREAM.name,
                    limit="bytes",
                    used=round(used, 4),
                    limit_value=max_bytes,
                    current_value=stored_bytes,
                    oldest_at=oldest_at,
                )
            )
    if max_age_s and oldest_at is not None:
        age_s = max(0.0, (now - oldest_at).total_seconds())
        if age_s / max_age_s >= warn_at:
            warnings.append(
                StreamLimitApproaching(
                    stream=EVENTS_STREAM.name,
                    limit="age",
                    used=round(age_s / max_age_s, 4),
                    limit_value=max_age_s,
                    current_value=age_s,
                    oldest_at=oldest_at,
                )
            )
    return warnings


class RetentionWatch:
    """Checks the events stream every `interval_s` and publishes `stream.limit_approaching`
    on the ops stream when a limit is `warn_at` used, then again at each further 5 %."""

    def __init__(self, js: JetStreamContext, *, warn_at: float, interval_s: float) -> None:
        self._js = js
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
        warnings = approaching(
            max_age_s=info.config.max_age or None,
            max_bytes=info.config.max_bytes if (info.config.max_bytes or 0) > 0 else None,
            stored_bytes=info.state.bytes,
            oldest_at=oldest_at,
            now=datetime.now(UTC),
            warn_at=self._warn_at,
        )
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
            await self._js.publish(
                RETENTION_SUBJECT, encode_event(event), headers={Headers.MSG_ID: str(event.id)}
            )
