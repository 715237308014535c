"""History is never acted on: which of a consumer's events a service may decide on.

A service decides on an event once. Its decision is recorded in the session's log after the
event, caused by it (the ids derive from the cause, so JetStream stores it once). When the
log already holds, after an event handed over, the service's decision on it or the
session's end, the event is history: an import, a stream restored from a mirror, a consumer
reset to the start, or a redelivery. Then:

- after the session's end, the event is settled (whatever the service would do, it did, or
  the session went on to its end without it): it is not handed over at all, unless the
  service records what happened rather than starting work (`decides_after_end`);
- with a decision of the service's recorded, it is handed over as a redelivery, the case
  every handler already reads the log for, finishing what the log lacks (a call started
  but never ended is failed, not run again) and appending nothing it holds;
- otherwise it is the session's live edge, and handed over as it came.

To know, the log after the event is read once when a consumer meets a session, and again
only when an event comes that is not after what it was handed of the session (a reset): a
live session's later events come after what was read, and cost nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from cachetools import LRUCache

from helmline.contracts import SESSION_ENDINGS, ConsumerSpec
from helmline.runtime._consumer import Delivery
from helmline.runtime._store import EventStore

SESSIONS_KEPT = 10_000
"""Sessions whose log after the first event met a consumer remembers."""


@dataclass(slots=True)
class _Known:
    """What a consumer learnt of a session's log after an event it was handed."""

    read_to: int
    """The log's last sequence of the session when it was read."""
    decided: frozenset[uuid.UUID]
    """Events that the service's decisions read then were caused by."""
    ended_at: int
    """Sequence of the session's last end read then; 0 when it had none."""
    handed_to: int
    """The latest sequence of the session handed over since."""


class History:
    """Tells, for each event of a consumer, whether the service may act on it."""

    def __init__(self, store: EventStore, spec: ConsumerSpec, source: str) -> None:
        """`source`: that of the events in which the service records its decisions (an
        event of it caused by one handed over is its decision on it; types do not tell,
        as some have several publishers)."""
        self._store = store
        self._source = source
        self._after_end = spec.decides_after_end
        self._known: LRUCache[tuple[str, str], _Known] = LRUCache(SESSIONS_KEPT)

    async def admit(self, delivery: Delivery) -> Delivery | None:
        """The delivery to hand to the handler (marked as a redelivery when the log holds
        the service's decision on it), or None when the session ended after it."""
        if delivery.deliveries > 1:
            return delivery  # The handler reads the log for a redelivery anyway.
        event = delivery.event
        key = (event.tenant, event.session_id)
        known = self._known.get(key)
        # An event handed over before comes again only when the consumer starts over (a
        # reset): what was read then is older than what it must now be compared with.
        if known is None or delivery.seq <= known.handed_to:
            known = await self._read(event.tenant, event.session_id, delivery.seq)
            self._known[key] = known
        known.handed_to = max(known.handed_to, delivery.seq)
        if delivery.seq >= known.read_to:
            return delivery  # The live edge: nothing after it was in the log.
        if known.ended_at > delivery.seq and not self._after_end:
            return None
        if event.id in known.decided:
            return replace(delivery, deliveries=2)
        return delivery

    async def _read(self, tenant: str, session_id: str, seq: int) -> _Known:
        after = await self._store.read_all(tenant, session_id, after_seq=seq)
        return _Known(
            read_to=after[-1].seq if after else seq,
            decided=frozenset(
                stored.event.causation_id
                for stored in after
                if stored.event.source == self._source and stored.event.causation_id
            ),
            ended_at=max(
                (stored.seq for stored in after if stored.event.type in SESSION_ENDINGS),
                default=0,
            ),
            handed_to=seq,
        )
