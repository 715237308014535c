"""Instances of federated MCP servers: each one a gateway process started for everyone, for
one tenant or for one session (the server's `isolation`), and stopped again. Gateway-wide
facts, on the tools stream, not in a session's log.
"""

from __future__ import annotations

from typing import Literal, Self, TypeAlias

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import TOOL_GATEWAY
from helmline.contracts._values import Contract, SessionId, TenantId

Isolation: TypeAlias = Literal["shared", "tenant", "session"]
"""Who an MCP server's instance serves: every tenant and session (one instance), one tenant,
or one session (no state a server keeps ever reaches another session)."""

InstanceStopReason: TypeAlias = Literal["session_ended", "idle", "gateway_stopping"]
"""Why a gateway stopped an instance: the session it served ended, nobody called it for the
server's idle time, or the gateway process itself was stopping."""


class McpInstance(Contract):
    """One instance of an MCP server, and whom it serves."""

    server: str = Field(min_length=1, max_length=64)
    """The MCP server's id, as configured."""
    id: str = Field(min_length=1, max_length=64)
    """The instance's id, unique across gateways."""
    isolation: Isolation
    """Who it serves."""
    tenant: TenantId | None = None
    """The tenant it serves; None for a shared instance."""
    session_id: SessionId | None = None
    """The session it serves; None unless its isolation is `session`."""
    gateway: str = Field(min_length=1, max_length=256)
    """The gateway process that runs it: host name and process id."""


_NOTES = McpInstance(
    server="notes",
    id="9b2f4c1e-3d5a-4e6f-8a7b-0c1d2e3f4a5b",
    isolation="session",
    tenant="acme",
    session_id="s-42",
    gateway="gateway-7d9f/41",
)


class McpInstanceStarted(Payload, type="mcp.instance.started", published_by=(TOOL_GATEWAY,)):
    """A gateway process started an instance of an MCP server (a process over stdio, a
    connection over HTTP) for one tenant or one session, and it answered. Until its
    `mcp.instance.stopped`, the instance lives in that gateway process only: another replica
    that handles the session's next call starts one of its own, which holds none of this
    one's state (it names this one in `replaces`)."""

    instance: McpInstance
    """The instance."""
    start_ms: float = Field(ge=0)
    """Milliseconds from starting it to its first answer (its tools listed)."""
    replaces: str | None = Field(default=None, max_length=64)
    """The id of the instance for the same tenant or session that another gateway process
    started and never recorded as stopped (that process died, or the session's calls moved
    to this one): what it held is not in this one."""

    @classmethod
    def example(cls) -> Self:
        return cls(instance=_NOTES, start_ms=612.5)


class McpInstanceStopped(Payload, type="mcp.instance.stopped", published_by=(TOOL_GATEWAY,)):
    """A gateway process stopped an instance it had started (its process ended, its
    connection closed): what the server kept in it is gone."""

    instance: McpInstance
    """The instance, as its `mcp.instance.started` gave it."""
    reason: InstanceStopReason
    """Why it was stopped."""
    calls: int = Field(default=0, ge=0)
    """Calls it was sent while it ran."""

    @classmethod
    def example(cls) -> Self:
        return cls(instance=_NOTES, reason="session_ended", calls=3)
