"""Live events as server-sent events: a session's log, or a whole tenant's, as it grows.

Each SSE `id` is the event's stream sequence, so a client that reconnects with
`Last-Event-ID: N` continues exactly after event N: an ordered JetStream consumer starts at
N + 1 and delivers in stream order, with no gap and nothing twice. The `data` is the event's
CloudEvents JSON exactly as stored, so nothing is decoded per follower.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from helmline.api._auth import Viewer
from helmline.api._problems import PROBLEM_RESPONSES, ProblemDetails, not_found
from helmline.contracts import SessionId, parse_event_subject, session_filter, tenant_filter
from helmline.runtime import EventStore

KEEPALIVE_S = 15.0
"""A comment line this often keeps proxies from closing an idle stream."""

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

router = APIRouter(tags=["events"], responses=PROBLEM_RESPONSES)

SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
        "description": "Server-sent events: `id` is the stream sequence, `event` the event "
        "type, `data` the CloudEvents JSON.",
    },
    404: {"model": ProblemDetails, "description": "No such session in the principal's tenant"},
}

LastEventId = Annotated[
    int | None,
    Header(alias="Last-Event-ID", ge=0, description="Resume after this stream sequence"),
]
After = Annotated[
    int | None,
    Query(
        ge=0,
        description="Resume after this stream sequence (for clients that cannot set "
        "Last-Event-ID); the header wins when both are given",
    ),
]


@router.get(
    "/sessions/{session_id}/events", response_class=StreamingResponse, responses=SSE_RESPONSE
)
async def session_events(
    session_id: SessionId,
    principal: Viewer,
    request: Request,
    last_event_id: LastEventId = None,
    after: After = None,
) -> StreamingResponse:
    """The session's events from the start (or after `Last-Event-ID`), then live."""
    store: EventStore = request.app.state.store
    if await store.last_seq(principal.tenant, session_id) == 0:
        raise not_found(f"no session {session_id}")
    resume = last_event_id if last_event_id is not None else after
    start = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=(resume or 0) + 1
    )
    return _stream(request, session_filter(principal.tenant, session_id), start)


@router.get("/events", response_class=StreamingResponse, responses=SSE_RESPONSE)
async def tenant_events(
    principal: Viewer, request: Request, last_event_id: LastEventId = None, after: After = None
) -> StreamingResponse:
    """Every event of the tenant's sessions from now on (or after `Last-Event-ID`)."""
    resume = last_event_id if last_event_id is not None else after
    start = (
        ConsumerConfig(deliver_policy=DeliverPolicy.NEW)
        if resume is None
        else ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=resume + 1
        )
    )
    return _stream(request, tenant_filter(principal.tenant), start)


class OpenStreams:
    """The event streams being served, so that shutting down can end them."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Msg | None]] = set()

    @contextmanager
    def opened(self) -> Iterator[asyncio.Queue[Msg | None]]:
        queue: asyncio.Queue[Msg | None] = asyncio.Queue()
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)

    async def close_all(self) -> None:
        for queue in self._queues:
            queue.put_nowait(None)


def _stream(request: Request, subject_filter: str, start: ConsumerConfig) -> StreamingResponse:
    js: JetStreamContext = request.app.state.js
    streams: OpenStreams = request.app.state.streams
    return StreamingResponse(
        _frames(js, streams, subject_filter, start),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


async def _frames(
    js: JetStreamContext, streams: OpenStreams, subject_filter: str, start: ConsumerConfig
) -> AsyncIterator[bytes]:
    with streams.opened() as queue:

        async def deliver(message: Msg) -> None:
            queue.put_nowait(message)

        subscription = await js.subscribe(
            subject_filter, ordered_consumer=True, config=start, cb=deliver
        )
        try:
            # Sent at once, so a client knows the stream is open before the first event.
            yield b": connected\n\n"
            while True:
                try:
                    message = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if message is None:
                    return  # The API is shutting down; the client reconnects elsewhere.
                yield _frame(message)
        finally:
            await subscription.unsubscribe()


def _frame(message: Msg) -> bytes:
    seq = message.metadata.sequence.stream
    event_type = parse_event_subject(message.subject).event_type
    # Stored events are one line of JSON, which is one SSE data line.
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, event_type.encode(), message.data)
