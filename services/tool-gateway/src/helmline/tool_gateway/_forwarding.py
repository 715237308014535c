"""Calls handed between gateway processes: a tenant's or a session's instance of an MCP
server runs in the gateway process that started it, and a call of that tenant or session
that another process was handed goes to it there, so that what the server keeps stays in
one place. The process that runs an instance answers NATS requests on the instance's own
subject (`mcp_instance_calls_subject`): a call, a ping, or the end of the instance's session
(which only one gateway process hears). A request nobody listens to
(`no responders`) says at once that the instance is gone with its process.

The answer carries the call's result, or how it failed in the terms the gateway's handler
knows (a timeout, the server unavailable, sent or not, an MCP error, the pool full), so a
handed call ends as the same call made in place would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

import nats.errors
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, ErrorData
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, ConfigDict, JsonValue

from helmline.contracts import ToolError, mcp_instance_calls_subject
from helmline.tool_gateway._launcher import EgressRefusals
from helmline.tool_gateway._mcp import ServerUnavailable

logger = logging.getLogger(__name__)

PING = b"ping"
END = b"end"
"""Asks the process to stop the instance: the session it serves ended."""
PING_TIMEOUT_S = 2.0


class CallsTools(Protocol):
    """What a call is sent to: an instance in this process (`McpServer`), or in another."""

    egress_refused: EgressRefusals
    """Connections the instance's sandbox was refused (none known of one in another
    process: that process logs and counts them)."""

    async def call(
        self, remote_name: str, arguments: dict[str, Any], *, timeout_s: float, key: str
    ) -> CallToolResult: ...


class PoolFull(Exception):
    """A call found the pool of its server full (in this process, or in the one that runs
    the instance it needs) and was not sent: `error` says why (kind `rate_limited`),
    `retry_in_s` when a place may be free."""

    def __init__(self, error: ToolError, retry_in_s: float) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_in_s = retry_in_s


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HandedCall(_Wire):
    tool: str
    arguments: dict[str, JsonValue]
    timeout_s: float
    key: str


class HandedAnswer(_Wire):
    result: dict[str, JsonValue] | None = None
    failure: Literal["timeout", "unavailable", "mcp", "busy"] | None = None
    message: str = ""
    sent: bool = False
    """For `unavailable`: whether the call had been sent to the server."""
    code: int = 0
    data: JsonValue = None
    """For `mcp`: the error's code and data; for `busy`: the refusal, as a `ToolError`."""
    retry_in_s: float | None = None


class RemoteInstance:
    """An instance another gateway process runs, called through that process."""

    def __init__(self, nc: NATS, instance: str) -> None:
        self._nc = nc
        self._subject = mcp_instance_calls_subject(instance)
        self.instance = instance
        self.egress_refused = EgressRefusals()
        self.gone = False
        """Whether its process was found gone (nobody answers on its subject)."""

    async def alive(self) -> bool:
        """Whether a process answers for the instance (one that is busy, slowly, counts)."""
        try:
            await self._nc.request(self._subject, PING, timeout=PING_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            self.gone = True
            return False
        except nats.errors.TimeoutError:
            return True
        return True

    async def end(self) -> None:
        """Have its process stop it (its session ended); if it is gone, so is the instance."""
        try:
            await self._nc.request(self._subject, END, timeout=PING_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            self.gone = True
        except nats.errors.TimeoutError:
            # It stops when idle all the same.
            logger.warning("instance %s did not answer the end of its session", self.instance)

    async def call(
        self, remote_name: str, arguments: dict[str, Any], *, timeout_s: float, key: str
    ) -> CallToolResult:
        """Like `McpServer.call`; raises `PoolFull` when the other process's pool is."""
        handed = HandedCall(tool=remote_name, arguments=arguments, timeout_s=timeout_s, key=key)
        try:
            reply = await self._nc.request(
                self._subject, handed.model_dump_json().encode(), timeout=timeout_s
            )
        except nats.errors.NoRespondersError as error:
            self.gone = True
            raise ServerUnavailable("the gateway process that ran its instance is gone") from error
        except nats.errors.TimeoutError as error:
            raise TimeoutError from error
        answer = HandedAnswer.model_validate_json(reply.data)
        match answer.failure:
            case None:
                return CallToolResult.model_validate(answer.result)
            case "timeout":
                raise TimeoutError
            case "unavailable":
                raise ServerUnavailable(answer.message, sent=answer.sent)
            case "mcp":
                error_data = ErrorData(code=answer.code, message=answer.message, data=answer.data)
                raise MCPError(error_data.code, error_data.message, error_data.data)
            case "busy":
                raise PoolFull(ToolError.model_validate(answer.data), answer.retry_in_s or 0.0)


Lease = Callable[[], AbstractAsyncContextManager[CallsTools]]


class Answering:
    """Answers the calls other gateway processes hand to one instance of this process."""

    def __init__(
        self, nc: NATS, instance: str, lease: Lease, end: Callable[[], Awaitable[None]]
    ) -> None:
        """`lease`: a place for one call on the instance (raising `PoolFull` without one);
        `end`: stops the instance, its session having ended."""
        self._nc = nc
        self._subject = mcp_instance_calls_subject(instance)
        self._lease = lease
        self._end = end
        self._subscription: Subscription | None = None
        self._answering: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._subscription = await self._nc.subscribe(self._subject, cb=self._received)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def _received(self, message: Msg) -> None:
        # Each call in a task of its own: the client hands a subscription's messages over
        # one at a time, and calls in flight on one instance run side by side.
        task = asyncio.create_task(self._answer(message))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, message: Msg) -> None:
        if message.data == PING:
            await message.respond(PING)
            return
        if message.data == END:
            await self._end()
            await message.respond(END)
            return
        call = HandedCall.model_validate_json(message.data)
        answer = await _answered(self._lease, call)
        await message.respond(answer.model_dump_json().encode())


async def _answered(lease: Lease, call: HandedCall) -> HandedAnswer:
    try:
        result = await _sent(lease, call)
    except PoolFull as busy:
        return HandedAnswer(
            failure="busy",
            message=busy.error.message,
            data=busy.error.model_dump(mode="json"),
            retry_in_s=busy.retry_in_s,
        )
    except TimeoutError:
        return HandedAnswer(failure="timeout")
    except ServerUnavailable as error:
        return HandedAnswer(failure="unavailable", message=str(error), sent=error.sent)
    except MCPError as error:
        return HandedAnswer(
            failure="mcp", message=error.error.message, code=error.code, data=error.error.data
        )
    except OSError as error:
        # The transport failed under the call: it may have been sent.
        return HandedAnswer(failure="unavailable", message=str(error), sent=True)
    return HandedAnswer(result=result.model_dump(mode="json", by_alias=True, exclude_none=True))


async def _sent(lease: Lease, call: HandedCall) -> CallToolResult:
    async with lease() as instance:
        return await instance.call(
            call.tool, dict(call.arguments), timeout_s=call.timeout_s, key=call.key
        )
