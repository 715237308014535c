"""One live JetStream feed per followed subject, shared by every client following it.

Hundreds of people may watch one busy session. Each followed subject (a session's, a
tenant's) gets one ordered consumer in this process, whose messages are turned into SSE
frames once and handed to every follower's queue. A follower that resumes after a sequence
first joins the live feed, then reads what it missed from the stream up to the subject's
last sequence at that moment, then takes the live frames it has not seen: stream sequences
order it all, so there is no gap and nothing twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from helmline.contracts import EVENTS_STREAM, parse_event_subject

Frame = tuple[int, bytes]
"""A stream sequence and its SSE frame."""

Followed = asyncio.Queue[Frame | None]
"""A follower's live frames; None when the API shuts down."""

KEEPALIVE_S = 15.0
KEEPALIVE: Frame = (0, b": keepalive\n\n")
"""A comment frame sent this often, so that proxies keep an idle stream open."""


def sse_frame(message: Msg) -> Frame:
    seq = message.metadata.sequence.stream
    event_type = parse_event_subject(message.subject).event_type
    # Stored events are one line of JSON, which is one SSE data line.
    return seq, b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, event_type.encode(), message.data)


class _Feed:
    def __init__(self) -> None:
        self.followers: set[Followed] = set()
        self.subscription: JetStreamContext.PushSubscription | None = None
        self.started = asyncio.Event()
        # One timer per feed rather than a timeout per frame and follower: waiting on a
        # queue with a timeout costs a task each time, which 200 followers feel.
        self.keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    async def deliver(self, message: Msg) -> None:
        frame = sse_frame(message)
        for queue in self.followers:
            queue.put_nowait(frame)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            for queue in self.followers:
                queue.put_nowait(KEEPALIVE)

    async def close(self) -> None:
        self.keepalive.cancel()
        if self.subscription is not None:
            await self.subscription.unsubscribe()


class FanOut:
    """The live feeds of this API process."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._feeds: dict[str, _Feed] = {}

    @asynccontextmanager
    async def follow(
        self, subject_filter: str, *, after: int | None
    ) -> AsyncIterator[AsyncIterator[Frame | None]]:
        """Frames of the subject after sequence `after` (None: only new ones) while the block
        runs; None once the API is shutting down."""
        queue: Followed = asyncio.Queue()
        feed = await self._join(subject_filter, queue)
        try:
            yield self._frames(subject_filter, queue, after)
        finally:
            feed.followers.discard(queue)
            if not feed.followers and self._feeds.get(subject_filter) is feed:
                del self._feeds[subject_filter]
                await feed.close()

    async def close_all(self) -> None:
        for feed in self._feeds.values():
            for queue in feed.followers:
                queue.put_nowait(None)

    async def _join(self, subject_filter: str, queue: Followed) -> _Feed:
        feed = self._feeds.get(subject_filter)
        if feed is None:
            feed = self._feeds[subject_filter] = _Feed()
            feed.followers.add(queue)
            feed.subscription = await self._js.subscribe(
                subject_filter,
                ordered_consumer=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
                cb=feed.deliver,
            )
            feed.started.set()
        else:
            feed.followers.add(queue)
            await feed.started.wait()
        return feed

    async def _frames(
        self, subject_filter: str, queue: Followed, after: int | None
    ) -> AsyncIterator[Frame | None]:
        last = after
        if after is not None:
            async for missed in self._missed(subject_filter, after):
                last = missed[0]
                yield missed
        while True:
            live = await queue.get()
            if live is KEEPALIVE:
                yield KEEPALIVE
                continue
            # What else is queued goes out in the same write: a follower that fell behind
            # catches up in a few large writes rather than many small ones.
            batch: list[bytes] = []
            while live is not None:
                if live is not KEEPALIVE and (last is None or live[0] > last):
                    last = live[0]
                    batch.append(live[1])
                if queue.empty():
                    break
                live = queue.get_nowait()
            if batch and last is not None:
                yield last, b"".join(batch)
            if live is None:
                yield None
                return

    async def _missed(self, subject_filter: str, after: int) -> AsyncIterator[Frame]:
        """The stored frames after `after`, up to the subject's last event at this moment;
        the live feed, joined before, has everything stored later."""
        try:
            end = (await self._js.get_last_msg(EVENTS_STREAM.name, subject_filter)).seq or 0
        except NotFoundError:
            return
        if end <= after:
            return
        history: asyncio.Queue[Msg] = asyncio.Queue()

        async def deliver(message: Msg) -> None:
            history.put_nowait(message)

        subscription = await self._js.subscribe(
            subject_filter,
            ordered_consumer=True,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1
            ),
            cb=deliver,
        )
        try:
            while True:
                frame = sse_frame(await history.get())
                yield frame
                if frame[0] >= end:
                    return
        finally:
            await subscription.unsubscribe()
