"""The gateway's HTTP transport to Streamable HTTP MCP servers.

The MCP SDK reports any error status of a call as a bare JSON-RPC internal error. The
gateway needs the status itself: a 401 or 403 refuses the gateway's credentials, which no
retry mends, and the server is not down; a 429 (from the server or a proxy in front of it)
is rate limiting, not a server down, and says when to try again; a 503 was not handled and
may say when to try again; a 502 or 504 from a proxy may come after the server ran the
call, so its outcome is unknown and a tool that is not idempotent must not be sent again; a
404 to a request of an MCP session says the server no longer knows the session (it was
started again, or the request reached another replica of it), which the protocol mends by
starting a new one.
This transport hands such an answer to the call that caused it as a JSON-RPC error of its
own, which the SDK passes on as it is, carrying the status and the server's Retry-After.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httpx2

from helmline.runtime import retry_after_s

HANDED_OVER = frozenset({401, 403, 404, 429, 502, 503, 504})
"""Statuses whose meaning the gateway acts on; other error statuses stay the SDK's."""
REFUSED_OVER_HTTP = -32029
"""JSON-RPC code (implementation-defined server error) of a call answered with one of them."""
MARK = "helmline/http-status"
"""In the error's `data`: this transport made the error, not the server."""


class HttpStatusAware(httpx2.AsyncBaseTransport):
    """Wraps a transport; turns an answer to a JSON-RPC request with one of the statuses
    `HANDED_OVER` into a JSON-RPC error naming the status."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code not in HANDED_OVER or request.method != "POST":
            return response
        request_id = _request_id(request.content)
        if request_id is None:
            return response  # A notification: nothing waits for its answer.
        await response.aread()
        await response.aclose()
        status = HTTPStatus(response.status_code)
        error = {
            "code": REFUSED_OVER_HTTP,
            "message": f"the server answered {status.value} {status.phrase}",
            "data": {
                "by": MARK,
                "status": status.value,
                "retry_after_s": retry_after_s(response.headers),
            },
        }
        return httpx2.Response(
            status.value,
            json={"jsonrpc": "2.0", "id": request_id, "error": error},
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _request_id(body: bytes) -> Any:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message.get("id") if isinstance(message, dict) else None


@dataclass(frozen=True, slots=True)
class HttpRefusal:
    """A call answered with an error status, as this transport handed it over."""

    status: int
    """One of `HANDED_OVER`."""
    retry_after_s: float | None
    """The wait the server asked for, if it said."""


def http_refusal(data: Any) -> HttpRefusal | None:
    """The error status a JSON-RPC error's `data` carries, when this transport made it."""
    if not isinstance(data, dict) or data.get("by") != MARK:
        return None
    status, wait = data.get("status"), data.get("retry_after_s")
    if not isinstance(status, int):
        return None
    return HttpRefusal(status, float(wait) if isinstance(wait, int | float) else None)
