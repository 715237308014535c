"""The gateway's HTTP transport to Streamable HTTP MCP servers.

The MCP SDK reports any error status of a call as a bare JSON-RPC internal error, so a
server (or the proxy in front of it) answering 429 Too Many Requests would look down: the
call would count against its breaker, and its Retry-After would be lost. This transport
hands a 429 to the call that caused it as a JSON-RPC error of its own, which the SDK passes
on as it is, carrying the wait the server asked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx2

from helmline.runtime import retry_after_s

RATE_LIMITED = -32029
"""JSON-RPC code (implementation-defined server error) of a call the server refused with 429."""
RATE_LIMITED_MARK = "helmline/http-429"
"""In the error's `data`: this transport made the error, not the server."""


class RateLimitAware(httpx2.AsyncBaseTransport):
    """Wraps a transport; turns a 429 answer to a JSON-RPC request into a JSON-RPC error."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code != 429 or request.method != "POST":
            return response
        request_id = _request_id(request.content)
        if request_id is None:
            return response  # A notification: nothing waits for its answer.
        await response.aread()
        await response.aclose()
        error = {
            "code": RATE_LIMITED,
            "message": "the server answered 429 Too Many Requests",
            "data": {"by": RATE_LIMITED_MARK, "retry_after_s": retry_after_s(response.headers)},
        }
        return httpx2.Response(
            429,
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
class TooManyRequests:
    """A call the server answered 429, as this transport handed it over."""

    retry_after_s: float | None
    """The wait the server asked for, if it said."""


def too_many_requests(data: Any) -> TooManyRequests | None:
    """The 429 a JSON-RPC error's `data` carries, when this transport made the error."""
    if not isinstance(data, dict) or data.get("by") != RATE_LIMITED_MARK:
        return None
    wait = data.get("retry_after_s")
    return TooManyRequests(float(wait) if isinstance(wait, int | float) else None)
