"""Live events as server-sent events: a session's log, or a whole tenant's, as it grows.

Each SSE `id` is the event's stream sequence, so a client that reconnects with
`Last-Event-ID: N` continues exactly after event N, with no gap and nothing twice (see
`_fanout`). The `data` is the event's CloudEvents JSON exactly as stored, so nothing is
decoded per follower.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from helmline.api._auth import Viewer
from helmline.api._fanout import FanOut
from helmline.api._problems import PROBLEM_RESPONSES, ProblemDetails, not_found
from helmline.contracts import SessionId, session_filter, tenant_filter
from helmline.runtime import EventStore

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
    return _stream(request, session_filter(principal.tenant, session_id), resume or 0)


@router.get("/events", response_class=StreamingResponse, responses=SSE_RESPONSE)
async def tenant_events(
    principal: Viewer, request: Request, last_event_id: LastEventId = None, after: After = None
) -> StreamingResponse:
    """Every event of the tenant's sessions from now on (or after `Last-Event-ID`)."""
    resume = last_event_id if last_event_id is not None else after
    return _stream(request, tenant_filter(principal.tenant), resume)


def _stream(request: Request, subject_filter: str, after: int | None) -> StreamingResponse:
    fan_out: FanOut = request.app.state.fan_out
    return StreamingResponse(
        _sse(fan_out, subject_filter, after), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _sse(fan_out: FanOut, subject_filter: str, after: int | None) -> AsyncIterator[bytes]:
    async with fan_out.follow(subject_filter, after=after) as frames:
        # Sent at once, so a client knows the stream is open before the first event.
        yield b": connected\n\n"
        async for frame in frames:
            if frame is None:
                return  # The API is shutting down; the client reconnects elsewhere.
            yield frame[1]
