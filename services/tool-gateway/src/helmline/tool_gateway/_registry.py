"""The federated registry: each MCP server's listed tools, as the control plane knows them.

Pure: listings and configuration in, `ToolSpec`s and the registry event out. A tool's MCP
annotations set the defaults of its spec, and the servers file overrides each field it names:
`readOnlyHint` makes a tool change nothing (`effect: none`, so it never stands in the way of a
rollback) and read (`action: read`); `destructiveHint` (on a tool not read-only) makes it high
risk and a deletion; `idempotentHint` lets a call whose outcome is unknown be sent again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from helmline.contracts import (
    BUILTIN_TOOLS,
    MCP_NAME_SEPARATOR,
    McpPrompt,
    McpResource,
    Risk,
    ServerHealth,
    ToolAction,
    ToolDefinition,
    ToolEffect,
    ToolRegistryPublished,
    ToolServerStatus,
    ToolSpec,
)
from helmline.tool_gateway._config import Rate, RateLimit, ServerConfig, ToolOverride
from helmline.tool_gateway._resilience import CircuitState

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class Listed:
    """A tool as its server last listed it, and its digest, worked out once per listing (not
    once per call: it costs tens of microseconds)."""

    definition: ToolDefinition
    digest: str


@dataclass(frozen=True, slots=True)
class ServerView:
    """What the registry says of one server: its tools (if listed) and how it is doing."""

    config: ServerConfig
    tools: tuple[ToolSpec, ...] = ()
    listed: Mapping[str, Listed] = field(default_factory=dict[str, Listed])
    """Its tools as it last listed them, by registry name (none before it listed them: the
    tools remembered from the last registry published have no definitions)."""
    available: bool = False
    error: str | None = "not connected yet"
    circuit: CircuitState = "closed"
    failures: int = 0
    """Consecutive failures of calls counted against the server (its breaker's count)."""
    missed_heartbeats: int = 0
    """Heartbeats in a row it left unanswered."""
    restarts: int = 0
    """Times it was started anew (a new process over stdio, a new connection over HTTP)
    after it had been up."""
    retry_at: float | None = None
    """When the next attempt to start it begins, on `time.monotonic()`'s clock, while it is
    down."""
    resources: tuple[McpResource, ...] = ()
    """The resources it last listed (`_resources`)."""
    prompts: tuple[McpPrompt, ...] = ()
    """The prompts it last listed."""

    @property
    def health(self) -> ServerHealth:
        """How the server is doing, in one word (see `ToolServerStatus.health`)."""
        if not self.available:
            return "dead"
        if self.circuit == "open" or self.missed_heartbeats:
            return "unresponsive"
        if self.failures or self.circuit == "half_open":
            return "degraded"
        return "healthy"


def registry_name(server: str, tool: str) -> str:
    """A federated tool's name: the server's id, `__`, the tool's own name. Always prefixed,
    so a name never changes when another server starts offering the same tool."""
    return f"{server}{MCP_NAME_SEPARATOR}{tool}"


def listed_by_name(config: ServerConfig, listed: Iterable[ToolDefinition]) -> dict[str, Listed]:
    """A server's listed tools by registry name."""
    return {registry_name(config.id, tool.name): Listed(tool, tool.digest) for tool in listed}


def tool_specs(config: ServerConfig, listed: Iterable[ToolDefinition]) -> tuple[ToolSpec, ...]:
    """The registry entries of a server's listed tools: their annotations' defaults, with the
    configuration's overrides."""
    specs = []
    for tool in listed:
        override = config.tools.get(tool.name) or ToolOverride()
        read_only = tool.hints("readOnlyHint")
        destructive = tool.hints("destructiveHint") and not read_only
        pure = override.pure
        # What it changes, as declared by the file or by the server; None when neither said.
        declared_effect: ToolEffect | None = "none" if pure else override.effect
        if declared_effect is None and read_only:
            declared_effect = "none"
        action: ToolAction | None = override.action
        if action is None:
            action = "read" if read_only else "delete" if destructive else None
        specs.append(
            ToolSpec(
                name=registry_name(config.id, tool.name),
                description=tool.description,
                parameters=dict(tool.input_schema) or _ANY_OBJECT,
                risk=override.risk or ("high" if destructive else config.risk),
                executor="mcp",
                timeout_s=override.timeout_s or config.timeout_s,
                inverse=override.inverse,
                idempotent=_resendable(override, tool, declared_effect, action),
                effect=declared_effect or "external",
                pure=pure,
                action=action,
                server=config.id,
                remote_name=tool.name,
                required_permission=override.required_permission,
                trust=override.trust or config.trust,
                definition_digest=tool.digest,
            )
        )
    return tuple(sorted(specs, key=lambda spec: spec.name))


def _resendable(
    override: ToolOverride,
    tool: ToolDefinition,
    effect: ToolEffect | None,
    action: ToolAction | None,
) -> bool:
    """Whether a call whose outcome is unknown (its server died with it in flight) may be sent
    again: the tool is declared idempotent (by the file, or by its server's `idempotentHint`),
    or read-only (pure, `effect: none`, or `action: read` with no other effect), and the file
    does not say `idempotent: false`."""
    if override.idempotent is not None:
        return override.idempotent
    reads = action == "read" and effect in (None, "none")
    return tool.hints("idempotentHint") or override.pure or effect == "none" or reads


def rate_limit_of(
    config: ServerConfig,
    remote_name: str,
    risk: Risk,
    by_risk: Mapping[Risk, RateLimit],
    tenant: str,
) -> Rate | None:
    """The rate of one tenant's calls of one tool: the tool's own limit, else its server's,
    else the default for the risk the call was authorised at; each may set the tenant's own."""
    override = config.tools.get(remote_name)
    limit = (override and override.rate_limit) or config.rate_limit or by_risk.get(risk)
    return limit.of_tenant(tenant) if limit is not None else None


def registry_event(views: Iterable[ServerView]) -> ToolRegistryPublished:
    """The registry as published: built-in tools, then every server's, and each server's state."""
    views = tuple(views)
    return ToolRegistryPublished(
        tools=(*BUILTIN_TOOLS, *(tool for view in views for tool in view.tools)),
        servers=tuple(
            ToolServerStatus(
                server=view.config.id,
                transport="stdio" if view.config.stdio is not None else "http",
                available=view.available,
                error=view.error,
                tools=len(view.tools),
                circuit=view.circuit,
                health=view.health,
                failures=view.failures + view.missed_heartbeats,
                resources=view.resources,
                prompts=view.prompts,
                isolation=view.config.isolation,
            )
            for view in views
        ),
    )
