"""Reading the log as it grows: one session's new events, every session's (filtered), and
the sessions of a tenant.

All use ordered consumers (ephemeral, flow-controlled, restarted by the client on a gap),
which deliver in stream order without a durable consumer left behind on the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from helmline.contracts import (
    EVENTS_STREAM,
    SessionStarted,
    UndecodableEvent,
    decode_event,
    event_type_filter,
    parse_event_subject,
    session_filter,
)
from helmline.runtime import StoredEvent, through_elections

logger = logging.getLogger(__name__)


@asynccontextmanager
async def following(
    js: JetStreamContext, tenant: str, session_id: str, *, after_seq: int
) -> AsyncIterator[AsyncIterator[StoredEvent]]:
    """The session's events after `after_seq`, as they are appended, while the block runs."""
    async with _Ordered(js, session_filter(tenant, session_id), start_seq=after_seq + 1) as feed:
        yield _decoded(feed)


@asynccontextmanager
async def tailing(
    js: JetStreamContext, subject_filter: str, *, from_seq: int
) -> AsyncIterator[AsyncIterator[StoredEvent]]:
    """Events of every session on matching subjects from `from_seq` on, as they are appended."""
    async with _Ordered(js, subject_filter, start_seq=from_seq) as feed:
        yield _decoded(feed)


async def last_started_seq(
    js: JetStreamContext, tenant: str, event_type: str = SessionStarted.TYPE
) -> int:
    """Sequence of the tenant's latest `session.started` (or event of `event_type`); 0 when
    it has none."""
    try:
        last = await through_elections(
            lambda: js.get_last_msg(EVENTS_STREAM.name, event_type_filter(event_type, tenant))
        )
    except NotFoundError:
        return 0
    return last.seq or 0


async def session_ids(
    js: JetStreamContext, tenant: str, event_type: str = SessionStarted.TYPE
) -> list[str]:
    """Every session of the tenant that was started (or has an event of `event_type`), in
    the order of its first such event. Reads subjects only: no event is decoded."""
    end = await last_started_seq(js, tenant, event_type)
    if end == 0:
        return []
    started = event_type_filter(event_type, tenant)
    ids: dict[str, None] = {}
    async with _Ordered(js, started, start_seq=1) as feed:
        async for message in feed:
            # The subject names the session, so nothing needs decoding.
            ids.setdefault(parse_event_subject(message.subject).session_id, None)
            if message.metadata.sequence.stream >= end:
                break
    return list(ids)


class _Ordered:
    """An ordered consumer's messages, subscribed for the duration of an `async with`."""

    def __init__(self, js: JetStreamContext, subject: str, *, start_seq: int) -> None:
        self._js = js
        self._subject = subject
        self._start_seq = start_seq
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._subscription: JetStreamContext.PushSubscription | None = None

    async def __aenter__(self) -> _Ordered:
        async def deliver(message: Msg) -> None:
            self._queue.put_nowait(message)

        # Making the consumer needs the cluster's leaders: a command begun during an
        # election waits for them, as appends do.
        self._subscription = await through_elections(
            lambda: self._js.subscribe(
                self._subject,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                config=ConsumerConfig(opt_start_seq=self._start_seq),
                cb=deliver,
            )
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()

    def __aiter__(self) -> _Ordered:
        return self

    async def __anext__(self) -> Msg:
        return await self._queue.get()


async def _decoded(feed: _Ordered) -> AsyncIterator[StoredEvent]:
    async for message in feed:
        seq = message.metadata.sequence.stream
        try:
            event = decode_event(message.data)
        except UndecodableEvent as error:
            # A foreign or newer publisher's message: left out, never a crash mid-follow.
            logger.warning("skipping undecodable message %d on %s: %s", seq, message.subject, error)
            continue
        yield StoredEvent(seq=seq, event=event)
