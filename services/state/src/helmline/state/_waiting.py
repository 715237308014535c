"""Counting what the whole stack has not finished, for dashboards, alerts and autoscaling:
sessions not ended, and approval requests waiting for a person.

The counts come from the read model, which every session reaches whichever replica handled
its events; a service's own metrics see only what its replica started.
"""

from __future__ import annotations

import asyncio
import logging

from helmline.runtime import ServiceMetrics
from helmline.state._projection import UNAVAILABLE, ReadModel

logger = logging.getLogger(__name__)


class WaitingCount:
    """Counts in the read model every `interval_s` into the metrics (`ServiceMetrics.waiting`)."""

    def __init__(self, model: ReadModel, metrics: ServiceMetrics, *, interval_s: float) -> None:
        self._model = model
        self._metrics = metrics
        self._interval_s = interval_s

    async def run(self) -> None:
        while True:
            try:
                await self.count()
            except UNAVAILABLE as error:
                # The metrics keep their last values; the projection retries on its own.
                logger.warning("could not count the sessions and approvals waiting: %r", error)
            await asyncio.sleep(self._interval_s)

    async def count(self) -> None:
        waiting = await self._model.waiting()
        self._metrics.waiting(waiting.sessions, waiting.approvals, waiting.oldest_approval_at)
