"""Bounded request bodies, enforced once for every route, as the body arrives.

A body is counted as it is received, whatever its `Content-Length` says or whether it has
one (chunked): past the limit the request is answered 413 and the rest is never read. A
declared length over the limit is refused before a byte of the body is read.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from helmline.api._problems import ProblemDetails, problem_response
from helmline.contracts import QUOTED_BYTES, quoted


class BodyTooLarge(HTTPException):
    """A body past the limit; answered 413 by the problem handlers like any HTTP error."""

    def __init__(self, limit: int, head: bytes) -> None:
        super().__init__(413, _detail(limit, head))


def _detail(limit: int, head: bytes) -> str:
    start = f"; it began {quoted(head)}" if head else ""
    return (
        f"the request body is larger than the {limit} bytes the API accepts "
        f"(HELMLINE_API_MAX_BODY_BYTES){start}; nothing was done"
    )


class BodyLimit:
    """ASGI middleware: at most `max_bytes` of request body, counted as it arrives."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self._app = app
        self._max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self._max_bytes:
            detail = _detail(self._max_bytes, b"") + f" (it declared {declared} bytes)"
            # Closing is the only way not to read the body: the client learns why first.
            response = problem_response(
                ProblemDetails(title="Content Too Large", status=413, detail=detail),
                {"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        received = 0
        head = b""

        async def counted() -> Message:
            nonlocal received, head
            message = await receive()
            if message["type"] == "http.request":
                chunk: bytes = message.get("body", b"")
                received += len(chunk)
                if len(head) < QUOTED_BYTES:
                    head += chunk[: QUOTED_BYTES + 1 - len(head)]
                if received > self._max_bytes:
                    raise BodyTooLarge(self._max_bytes, head)
            return message

        await self._app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # The server refuses a malformed length before we see it.
    return None
