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

A stdio server's process is watched through its output: when that ends (the process exited,
or was killed), the server is marked dead at once, calls in flight fail as sent with their
outcome unknown, and the process is started anew after a pause. The pause doubles with each
restart of a server that did not stay up (0.5 s, 1 s, ... up to 30 s) and starts over once it
has stayed up for 30 s, so a server that crashes at once is not started in a tight loop. A
call to a server that is down waits for the next attempt to start it, when that attempt is
due within the call's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, TextIO, cast

import anyio
import httpx2
from mcp import Client
from mcp.client._transport import ReadStream, Transport, TransportStreams
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    CallToolResult,
    PromptListChangedNotification,
    RequestParamsMeta,
    ResourceListChangedNotification,
    ServerNotification,
    ToolAnnotations,
    ToolListChangedNotification,
)
from mcp_types import CONNECTION_CLOSED

from helmline.contracts import ToolDefinition, ToolSpec
from helmline.runtime import make_text_safe
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._http import HttpRefusal, HttpStatusAware, http_refusal
from helmline.tool_gateway._launcher import EgressRefusals, ServerLauncher
from helmline.tool_gateway._registry import ServerView, listed_by_name, tool_specs
from helmline.tool_gateway._resilience import CircuitBreaker
from helmline.tool_gateway._resources import (
    list_prompts,
    list_resources,
    read_resource,
    reads_resource,
    with_reader,
)

logger = logging.getLogger(__name__)

RECONNECT_MIN_S = 0.5
RECONNECT_MAX_S = 30.0
STABLE_S = 30.0
"""A server that stayed up this long had recovered: if it goes down, it is started anew
after the shortest pause again."""


class ServerUnavailable(Exception):
    """The server is not connected (down at start, or dropped and not back yet), or the
    connection was lost; `sent`: whether the call had been sent, so it may have taken effect."""

    def __init__(self, reason: str, *, sent: bool = False) -> None:
        super().__init__(reason)
        self.sent = sent


class McpServer:
    """One configured server: its connection, its registry view and its circuit breaker."""

    def __init__(
        self,
        config: ServerConfig,
        on_change: Callable[[], None],
        launcher: ServerLauncher | None = None,
    ) -> None:
        self.config = config
        self.launcher = launcher or ServerLauncher()
        self.view = ServerView(config)
        self.breaker = CircuitBreaker(config.circuit.failures, config.circuit.reset_s)
        self._on_change = on_change
        self._client: Client | None = None
        self._ended = asyncio.Event()
        """Set when the current connection's transport ends (a stdio server's process exits)."""
        self._relist = asyncio.Event()
        self._reconnect = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self._dropped_because = "connection lost"
        self.egress_refused = EgressRefusals()
        """Connections its sandbox was refused (a stdio server allowed some hosts)."""
        self.credentials_refused: HttpRefusal | None = None
        """The 401 or 403 the server answered the last attempt to connect with, if it did."""
        self._tried = asyncio.Event()
        self._next_try_at: float | None = time.monotonic()
        """When the next attempt to connect begins (`time.monotonic()`); None while up."""
        self._up_since: float | None = None
        self._was_up = False
        self._failed_tries = 0
        """Attempts to connect that failed; a connection that drops later is not one."""
        self._settled = asyncio.Event()
        """Set, and replaced, whenever an attempt to connect ends or a connection drops."""
        self._attempting = False
        """Whether an attempt to connect, or the connection it made, is not yet known to
        have failed."""
        self._pause_s = RECONNECT_MIN_S
        """The pause before the next attempt after a failure."""

    @property
    def tried(self) -> bool:
        """Whether the first attempt to connect has ended (until then the server's health is
        not known)."""
        return self._tried.is_set()

    def remember(self, tools: tuple[ToolSpec, ...]) -> None:
        """Know the server's tools as last published, until it lists them itself: a gateway
        (re)starting then keeps them in the registry, unavailable, rather than withdrawing
        them while its server connects."""
        if not self.view.tools:
            self.view = replace(self.view, tools=tools)

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
        """Whether the server is connected. If it is not, waits up to `timeout_s` for the next
        attempt to connect (the first, or a restart) when that is under way or due by then;
        not when the server refused the gateway's credentials, which waiting does not mend."""
        deadline = time.monotonic() + timeout_s
        failed = self._failed_tries
        while not self.connected.is_set():
            now, due = time.monotonic(), self._next_try_at
            if (
                self.credentials_refused is not None
                or self._failed_tries > failed
                or due is None
                or due > deadline
                or now >= deadline
            ):
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), deadline - now)
        return True

    def sync_breaker(self) -> None:
        """Show the breaker's state and count of failures in the registry, if they moved."""
        breaker = self.breaker
        if (self.view.circuit, self.view.failures) != (breaker.state, breaker.failures):
            self._show(circuit=breaker.state, failures=breaker.failures)

    async def call(
        self, remote_name: str, arguments: dict[str, Any], *, timeout_s: float, key: str
    ) -> CallToolResult:
        """Call a tool; raises `TimeoutError`, `ServerUnavailable`, `MCPError` or a transport
        error. The idempotency key travels in the request's `_meta` for servers that use it.
        A server that is down is waited for within `timeout_s` (see `wait_connected`)."""
        deadline = time.monotonic() + timeout_s
        if not self.connected.is_set() and not await self.wait_connected(timeout_s):
            raise ServerUnavailable(self.view.error or "not connected")
        client, ended = self._client, self._ended
        assert client is not None, "connected without a client"
        try:
            # One deadline over the whole call, sending included; the SDK's own read timeout
            # would start later, so it could never fire first and is not armed.
            with anyio.fail_after(deadline - time.monotonic()):
                meta = cast(RequestParamsMeta, {"helmline/idempotency-key": key})
                if reads_resource(remote_name, self.view.listed.values()):
                    return await read_resource(client, arguments, meta)
                return await client.call_tool(remote_name, arguments, meta=meta)
        except _CONNECTION_LOST as error:
            self._drop(f"connection lost: {error}")
            raise ServerUnavailable(f"connection lost: {error}", sent=True) from error
        except MCPError as error:
            # The SDK ends a request in flight this way when the transport ends under it; over
            # HTTP also when one response stream ends, which leaves the connection up.
            if error.code == CONNECTION_CLOSED and ended.is_set():
                reason = f"{self._dropped_because} with the call in flight"
                raise ServerUnavailable(reason, sent=True) from error
            refusal = http_refusal(error.error.data)
            if refusal is not None and refusal.status == 404:
                # The server no longer knows the MCP session (it was started again, or
                # another replica of it took the request): the call did not run, and only a
                # new session, on a new connection, is answered again.
                reason = "it no longer knows the gateway's MCP session (HTTP 404)"
                self._drop(reason)
                raise ServerUnavailable(reason) from error
            raise

    async def _run(self) -> None:
        while True:
            self._attempting = True
            try:
                await self._serve()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self._went_down(error)
            assert self._next_try_at is not None
            await asyncio.sleep(max(0.0, self._next_try_at - time.monotonic()))

    def _went_down(self, error: BaseException) -> None:
        """Mark the server down (an attempt to connect failed, or the connection was lost)
        and set when it is tried next; once per attempt, whoever notices first."""
        if not self._attempting:
            return
        self._attempting = False
        now, up_since = time.monotonic(), self._up_since
        if up_since is not None and now - up_since >= STABLE_S:
            self._pause_s = RECONNECT_MIN_S  # It had recovered: soon, as after a first failure.
        if up_since is None:
            self._failed_tries += 1
        self._next_try_at = now + self._pause_s
        reason = _describe(error)
        logger.warning(
            "MCP server %s unavailable: %s; trying again in %.1f s",
            self.config.id,
            reason,
            self._pause_s,
        )
        self._pause_s = min(self._pause_s * 2, RECONNECT_MAX_S)
        self.credentials_refused = _credentials_refused(error)
        if self.credentials_refused is not None:
            reason = (
                f"it answered {self.credentials_refused.status}: it refused the "
                "gateway's credentials (its headers in the MCP servers file)"
            )
        self._client = None
        self._up_since = None
        self.connected.clear()
        self._tried.set()
        # Its tools stay listed (the last list it gave), marked unavailable: a call scheduled
        # while it restarts is then authorised and waits for it, rather than denied as of an
        # unknown tool, which failed sessions for a server that was back a second later.
        self._show(
            available=False,
            error=reason,
            missed_heartbeats=0,
            retry_at=self._next_try_at,
        )
        self._settle()

    def _show(self, **changes: Any) -> None:
        self.view = replace(self.view, **changes)
        self._on_change()

    def _settle(self) -> None:
        """Wake the calls waiting for an attempt to connect to end."""
        self._settled.set()
        self._settled = asyncio.Event()

    def _transport_ended(self, ended: asyncio.Event) -> None:
        """The transport of a connection ended: if it is the live one, the server is down
        from now on, before the calls in flight hear of it (`_serve` sees `ended` and closes
        the connection)."""
        if ended.is_set():
            return  # The gateway closed it (a stale connection dropped, or stopping).
        ended.set()
        if ended is self._ended and self.connected.is_set():
            self._dropped_because = self._end_reason()
            self._went_down(ServerUnavailable(self._end_reason()))

    def _end_reason(self) -> str:
        return "its process exited" if self.config.stdio is not None else "its connection closed"

    def _drop(self, reason: str) -> None:
        """Have the connection closed and made anew, for `reason`; calls from now on wait for
        the new one rather than go out on the one closing."""
        self._dropped_because = reason
        self.connected.clear()
        self._next_try_at = time.monotonic()
        self._reconnect.set()

    async def _serve(self) -> None:
        self._reconnect.clear()
        ended = asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            transport = _noticing_end(
                await self._transport(stack), lambda: self._transport_ended(ended)
            )
            client = await stack.enter_async_context(
                Client(transport, message_handler=self._notified)
            )
            for watch in (self._follow_tool_changes(client), self._beat(client)):
                stack.push_async_callback(_cancelled, asyncio.create_task(watch))
            # Leaving, the gateway closes the transport itself: that end is not the server's.
            stack.callback(ended.set)
            while True:
                self._relist.clear()
                listed = await _list_tools(client)
                resources, prompts = await list_resources(client), await list_prompts(client)
                restarted = 0
                if self._up_since is None:
                    restarted, self._was_up = int(self._was_up), True
                    self._up_since = time.monotonic()
                self._client, self._ended = client, ended
                self._next_try_at = None
                self.credentials_refused = None
                self.connected.set()
                self._tried.set()
                self._settle()
                logger.info("MCP server %s: %d tools", self.config.id, len(listed))
                self._show(
                    tools=tool_specs(self.config, with_reader(self.config.id, listed, resources)),
                    listed=listed_by_name(self.config, listed),
                    resources=resources,
                    prompts=prompts,
                    available=True,
                    error=None,
                    retry_at=None,
                    restarts=self.view.restarts + restarted,
                )
                woke = await _first_of(self._relist, self._reconnect, ended)
                if woke is self._reconnect:
                    raise ServerUnavailable(self._dropped_because)
                if woke is ended:
                    raise ServerUnavailable(self._end_reason())

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

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Transport:
        config = self.config
        if config.stdio is not None:
            return stdio_client(
                await self.launcher.stdio(config, stack, self.egress_refused),
                errlog=_logged_safely(config.id, stack),
            )
        assert config.http is not None
        # Our own HTTP client, for the configured headers; the event stream may stay quiet
        # for long, so only connecting and writing are bounded here (calls have their own).
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=await self.launcher.headers(config),
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
            async with client.listen(
                tools_list_changed=True, resources_list_changed=True, prompts_list_changed=True
            ) as changes:
                async for _ in changes:
                    self._relist.set()
        except ListenNotSupportedError:
            return
        except (SubscriptionLost, MCPError) as error:
            logger.warning(
                "MCP server %s: tool changes no longer followed: %s", self.config.id, error
            )

    async def _notified(self, message: ServerNotification | Exception) -> None:
        if isinstance(message, _LIST_CHANGED):
            self._relist.set()
        elif isinstance(message, Exception):
            logger.debug("MCP server %s: %s", self.config.id, message)


_LIST_CHANGED = (
    ToolListChangedNotification,
    ResourceListChangedNotification,
    PromptListChangedNotification,
)
"""What makes the gateway list a server's tools, resources and prompts again."""

_CONNECTION_LOST = (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError)


class _EndNoticed:
    """A transport's read stream that tells when it ends: the server's output closed (a
    stdio server's process exited) or the transport closed it."""

    def __init__(
        self, stream: ReadStream[SessionMessage | Exception], ended: Callable[[], None]
    ) -> None:
        self._stream = stream
        self._ended = ended

    @property
    def last_context(self) -> Any:
        """The sender's context of the last message, where the stream keeps one (the SDK's
        dispatcher reads it)."""
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended()
            raise

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> _EndNoticed:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _EndNoticed:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _noticing_end(
    transport: Transport, ended: Callable[[], None]
) -> AsyncIterator[TransportStreams]:
    async with transport as (read, write):
        yield _EndNoticed(read, ended), write


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


async def _list_tools(client: Client) -> list[ToolDefinition]:
    listed: list[ToolDefinition] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        listed.extend(
            ToolDefinition(
                name=tool.name,
                description=tool.description or tool.title or tool.name,
                input_schema=tool.input_schema,
                annotations=tool.annotations.model_dump(
                    mode="json", by_alias=True, exclude_none=True
                )
                if tool.annotations is not None
                else {},
            )
            for tool in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            return listed


def _annotations(annotations: ToolAnnotations | None) -> dict[str, Any]:
    """A tool's annotations as the protocol spells them (`readOnlyHint`), absent ones left out."""
    if annotations is None:
        return {}
    return annotations.model_dump(mode="json", by_alias=True, exclude_none=True)


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
    if isinstance(error, ServerUnavailable):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


STDERR_LINE_MAX_BYTES = 4096
"""A longer line of a server's stderr is cut, with a marker, in the gateway's log."""


def _logged_safely(server: str, stack: contextlib.AsyncExitStack) -> TextIO:
    """Where a stdio server's stderr goes: into the gateway's log through output safety, for
    a server's traceback may quote a secret it read (its own stderr would reach the log file
    untouched). What one write of the server brings (a traceback, say) is withheld whole if
    a secret is found in any of its lines: a server that wraps its lines splits what it
    quotes, and a piece of a secret alone is no longer recognisable."""
    readable, writable = os.pipe()
    writer = os.fdopen(writable, "w")

    def forward() -> None:
        pending = b""
        while chunk := os.read(readable, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            _log_burst(server, [line.decode(errors="replace") for line in lines])
        _log_burst(server, [pending.decode(errors="replace")] if pending else [])
        os.close(readable)

    threading.Thread(target=forward, name=f"mcp-stderr-{server}", daemon=True).start()
    # Once the server is gone too, the reader sees the end and the thread ends.
    stack.callback(writer.close)
    return writer


def _log_burst(server: str, lines: list[str]) -> None:
    safe = [make_text_safe(line, max_bytes=STDERR_LINE_MAX_BYTES) for line in lines]
    redacted: dict[str, int] = {}
    for _, outcome in safe:
        for rule, count in outcome.redacted_by.items():
            redacted[rule] = redacted.get(rule, 0) + count
    if redacted:
        rules = ", ".join(f"{rule} x{count}" for rule, count in sorted(redacted.items()))
        logger.warning(
            "MCP server %s: %d lines of its stderr withheld: they quote secrets (%s)",
            server,
            len(lines),
            rules,
        )
        return
    for text, _ in safe:
        logger.info("MCP server %s says: %s", server, text)
