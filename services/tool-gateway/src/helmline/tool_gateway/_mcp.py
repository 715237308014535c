"""Federated MCP servers: one connection each, kept up in a task of its own.

A server that is down at start (or drops later) is marked unavailable and reconnected in
the background with growing pauses; its tools come back into the registry when it does.
One that refuses the gateway's credentials as it connects (401 or 403) is tried again the
same way, since its owners may mend them on their side; until then, calls of its tools fail
as refused credentials, which trying again does not mend, rather than as unavailable.
A server's `tools/list_changed` makes the gateway list its tools again. A connected server
is asked for a heartbeat every `heartbeat.interval_s`: the first page of its tools, since the
2026-07-28 protocol has no `ping` and every server answers `tools/list`. After
`heartbeat.misses` unanswered heartbeats in a row the connection is stale, and the gateway
drops it and connects anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolResult,
    RequestParamsMeta,
    ServerNotification,
    ToolListChangedNotification,
)

from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._http import HttpRefusal, HttpStatusAware, http_refusal
from helmline.tool_gateway._registry import ListedTool, ServerView, tool_specs
from helmline.tool_gateway._resilience import CircuitBreaker

logger = logging.getLogger(__name__)

RECONNECT_MAX_S = 30.0


class ServerUnavailable(Exception):
    """The server is not connected (down at start, or dropped and not back yet)."""


class McpServer:
    """One configured server: its connection, its registry view and its circuit breaker."""

    def __init__(self, config: ServerConfig, on_change: Callable[[], None]) -> None:
        self.config = config
        self.view = ServerView(config)
        self.breaker = CircuitBreaker(config.circuit.failures, config.circuit.reset_s)
        self._on_change = on_change
        self._client: Client | None = None
        self._relist = asyncio.Event()
        self._reconnect = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self._dropped_because = "connection lost"
        self.credentials_refused: HttpRefusal | None = None
        """The 401 or 403 the server answered the last attempt to connect with, if it did."""
        self._tried = asyncio.Event()

    def start(self) -> None:
        """Connect in the background, and keep connected until `stop`."""
        self._task = asyncio.create_task(self._run(), name=f"mcp-{self.config.id}")

    async def stop(self) -> None:
        """Close the connection (a stdio server's process ends with it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_connected(self, timeout_s: float) -> bool:
        """Whether the server is connected; just after the start, waits up to `timeout_s`
        for the first attempt to connect to end."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._tried.wait(), timeout_s)
        return self.connected.is_set()

    def sync_breaker(self) -> None:
        """Show the breaker's state and count of failures in the registry, if they moved."""
        breaker = self.breaker
        if (self.view.circuit, self.view.failures) != (breaker.state, breaker.failures):
            self._show(circuit=breaker.state, failures=breaker.failures)

    async def call(
        self, remote_name: str, arguments: dict[str, Any], *, timeout_s: float, key: str
    ) -> CallToolResult:
        """Call a tool; raises `TimeoutError`, `ServerUnavailable`, `MCPError` or a transport
        error. The idempotency key travels in the request's `_meta` for servers that use it."""
        client = self._client
        if client is None:
            raise ServerUnavailable(self.view.error or "not connected")
        try:
            # One deadline over the whole call, sending included; the SDK's own read timeout
            # would start later, so it could never fire first and is not armed.
            with anyio.fail_after(timeout_s):
                return await client.call_tool(
                    remote_name,
                    arguments,
                    meta=cast(RequestParamsMeta, {"helmline/idempotency-key": key}),
                )
        except _CONNECTION_LOST as error:
            self._drop(f"connection lost: {error}")
            raise ServerUnavailable(f"connection lost: {error}") from error

    async def _run(self) -> None:
        pause = 0.5
        while True:
            try:
                await self._serve()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if self.connected.is_set():
                    pause = 0.5  # It was up: reconnect soon, as after a first failure.
                reason = _describe(error)
                logger.warning("MCP server %s unavailable: %s", self.config.id, reason)
                self.credentials_refused = _credentials_refused(error)
                if self.credentials_refused is not None:
                    reason = (
                        f"it answered {self.credentials_refused.status}: it refused the "
                        "gateway's credentials (its headers in the MCP servers file)"
                    )
                self._client = None
                self.connected.clear()
                self._tried.set()
                self._show(available=False, error=reason, tools=(), missed_heartbeats=0)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RECONNECT_MAX_S)

    def _show(self, **changes: Any) -> None:
        self.view = replace(self.view, **changes)
        self._on_change()

    def _drop(self, reason: str) -> None:
        """Have the connection closed and made anew, for `reason`."""
        self._dropped_because = reason
        self._reconnect.set()

    async def _serve(self) -> None:
        self._reconnect.clear()
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                Client(await self._transport(stack), message_handler=self._notified)
            )
            for watch in (self._follow_tool_changes(client), self._beat(client)):
                stack.push_async_callback(_cancelled, asyncio.create_task(watch))
            while True:
                self._relist.clear()
                listed = await _list_tools(client)
                self._client = client
                self.credentials_refused = None
                self.connected.set()
                self._tried.set()
                logger.info("MCP server %s: %d tools", self.config.id, len(listed))
                self._show(tools=tool_specs(self.config, listed), available=True, error=None)
                if await _first_of(self._relist, self._reconnect) is self._reconnect:
                    raise ServerUnavailable(self._dropped_because)

    async def _beat(self, client: Client) -> None:
        """Ask the server for a heartbeat at every interval; drop the connection as stale
        after too many heartbeats in a row went unanswered."""
        heartbeat = self.config.heartbeat
        while True:
            await asyncio.sleep(heartbeat.interval_s)
            try:
                with anyio.fail_after(heartbeat.timeout_s):
                    await client.list_tools(cache_mode="refresh")
            except (TimeoutError, MCPError, *_CONNECTION_LOST) as error:
                missed = self.view.missed_heartbeats + 1
                logger.warning(
                    "MCP server %s: heartbeat %d in a row unanswered: %s",
                    self.config.id,
                    missed,
                    _describe(error),
                )
                self._show(missed_heartbeats=missed)
                if missed >= heartbeat.misses:
                    self._drop(f"stale: {missed} heartbeats in a row unanswered")
                    return
            else:
                if self.view.missed_heartbeats:
                    self._show(missed_heartbeats=0)

    async def _transport(self, stack: contextlib.AsyncExitStack) -> StdioServerParameters | Any:
        config = self.config
        if config.stdio is not None:
            return StdioServerParameters(
                command=config.stdio.command,
                args=list(config.stdio.args),
                env=dict(config.stdio.env) or None,
                cwd=config.stdio.cwd,
            )
        assert config.http is not None
        # Our own HTTP client, for the configured headers; the event stream may stay quiet
        # for long, so only connecting and writing are bounded here (calls have their own).
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=config.http.headers,
                timeout=httpx2.Timeout(30.0, read=None),
                transport=HttpStatusAware(httpx2.AsyncHTTPTransport()),
            )
        )
        return streamable_http_client(config.http.url, http_client=http)

    async def _follow_tool_changes(self, client: Client) -> None:
        """List the tools again whenever the server says they changed. Servers of the
        2026-07-28 protocol say so on a `subscriptions/listen` stream; older ones send the
        notification unasked, to `_notified`."""
        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:
                    self._relist.set()
        except ListenNotSupportedError:
            return
        except (SubscriptionLost, MCPError) as error:
            logger.warning(
                "MCP server %s: tool changes no longer followed: %s", self.config.id, error
            )

    async def _notified(self, message: ServerNotification | Exception) -> None:
        if isinstance(message, ToolListChangedNotification):
            self._relist.set()
        elif isinstance(message, Exception):
            logger.debug("MCP server %s: %s", self.config.id, message)


_CONNECTION_LOST = (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _first_of(*events: asyncio.Event) -> asyncio.Event:
    """Wait until one of the events is set; that one."""
    waits = {asyncio.create_task(event.wait()): event for event in events}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return waits[next(iter(done))]


async def _list_tools(client: Client) -> list[ListedTool]:
    listed: list[ListedTool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        listed.extend(
            ListedTool(tool.name, tool.description or tool.title or tool.name, tool.input_schema)
            for tool in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            return listed


def _credentials_refused(error: BaseException) -> HttpRefusal | None:
    """The 401 or 403 among the causes of a failure to connect, if any."""
    if isinstance(error, BaseExceptionGroup):
        found = (_credentials_refused(inner) for inner in error.exceptions)
        return next((refusal for refusal in found if refusal is not None), None)
    if isinstance(error, MCPError):
        refusal = http_refusal(error.error.data)
        if refusal is not None and refusal.status in (401, 403):
            return refusal
    return None


def _describe(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in error.exceptions)
    if isinstance(error, MCPError):
        return f"MCP error {error.code}: {error.error.message}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
