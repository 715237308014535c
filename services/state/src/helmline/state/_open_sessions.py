"""Counting the sessions that have not ended, for dashboards and autoscaling.

The count comes from the read model, which every session reaches whichever replica handled
its events; a service's own gauge sees only the sessions that one replica started.
"""

from __future__ import annotations

import asyncio
import logging
from typing import get_args

from helmline.contracts import TERMINAL_STATUSES, SessionStatus
from helmline.runtime import ServiceMetrics
from helmline.state._projection import UNAVAILABLE, ReadModel

logger = logging.getLogger(__name__)

OPEN_STATUSES = tuple(
    status for status in get_args(SessionStatus) if status not in TERMINAL_STATUSES
)


class OpenSessionCount:
    """Sets the `sessions_open` metric from the read model every `interval_s`."""

    def __init__(self, model: ReadModel, metrics: ServiceMetrics, *, interval_s: float) -> None:
        self._model = model
        self._metrics = metrics
        self._interval_s = interval_s

    async def run(self) -> None:
        while True:
            try:
                await self.count()
            except UNAVAILABLE as error:
                # The gauge keeps its last value; the projection retries on its own.
                logger.warning("could not count the open sessions: %r", error)
            await asyncio.sleep(self._interval_s)

    async def count(self) -> None:
        counted = await self._model.open_sessions()
        for status in OPEN_STATUSES:
            self._metrics.sessions_open.labels(status).set(counted.get(status, 0))
