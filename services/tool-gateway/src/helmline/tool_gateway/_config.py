"""The MCP servers file: which servers the gateway federates, and how it treats their tools.

```yaml
servers:
  - id: git                       # tools become git__<tool>
    stdio: {command: python, args: [-m, mcp_server_git, --repository, /srv/repo], env: {}}
    risk: medium                  # default risk of its tools (high if not given)
    trust: trusted                # its results are not outside content (untrusted if not given)
    timeout_s: 10
    retries: 2                    # extra tries for retryable failures (idempotent or read-only
                                  # tools only when the outcome of a try is unknown)
    circuit: {failures: 5, reset_s: 30}
    heartbeat: {interval_s: 15, timeout_s: 5, misses: 2}   # stale after 2 unanswered
    rate_limit: {calls: 60, per_s: 60}   # per tool and tenant, shared by gateway replicas
    sandbox: {network: [api.example.com:443], read: [/srv/repo], write: [], memory_mb: 512}
    isolation: shared             # or tenant (an instance per tenant), session (per session)
    pool: {max_instances: 16, calls_per_instance: 8, max_calls: 64, queue: 128,
           queue_timeout_s: 10, idle_s: 300}   # see PoolSettings
    # rate_limit: {calls: 60, tenants: {acme: {calls: 600}}}   # acme has a rate of its own
    tools:
      git_commit: {risk: high, required_permission: repo.write, idempotent: false, action: write}
      git_create_branch:
        inverse: {tool: git__git_delete_branch, arguments: {name: /arguments/branch_name}}
  - id: tickets
    http: {url: "https://tickets.internal/mcp", headers: {Authorization: {secret: TICKETS_AUTH}}}
    tools:
      field_schema: {risk: low, pure: true}   # a session's same call is answered from the log
      read_ticket: {trust: untrusted}         # tickets are anyone's words, whatever the server
```

Every problem is reported with the file's line and the field at fault. A stdio server runs
in a sandbox (`_sandboxing`: what `sandbox:` may say, and what it sees without it); an
environment value or a header may be `{secret: NAME}` (`_server_secrets`).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from helmline.contracts import Isolation, Risk, TenantId, ToolAction, ToolEffect, ToolInverse, Trust
from helmline.tool_gateway._sandboxing import ServerSandbox
from helmline.tool_gateway._server_secrets import MaybeSecret
from helmline.yamlfile import (
    YamlFileError,
    compose,
    read_text,
    validation_problems,
)

SERVER_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
"""Server ids prefix tool names (`<id>__<tool>`): no underscores, so the split is plain."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StdioTransport(_Strict):
    """A server the gateway starts as a child process and talks to over stdin/stdout."""

    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, MaybeSecret] = Field(default_factory=dict)
    cwd: str | None = None


class HttpTransport(_Strict):
    """A server reached over MCP's Streamable HTTP transport."""

    url: str = Field(pattern=r"^https?://")
    headers: dict[str, MaybeSecret] = Field(default_factory=dict)


class CircuitSettings(_Strict):
    """When a server's breaker opens, and how long it stays open before a probe."""

    failures: int = Field(default=5, ge=1)
    reset_s: float = Field(default=30.0, gt=0)


class HeartbeatSettings(_Strict):
    """How often a connected server is asked for a heartbeat (a `tools/list`), and how many
    unanswered ones in a row make the gateway drop the connection as stale and connect anew."""

    interval_s: float = Field(default=15.0, gt=0)
    timeout_s: float = Field(default=5.0, gt=0)
    misses: int = Field(default=2, ge=1)


class Rate(_Strict):
    """At most `calls` calls per `per_s` seconds."""

    calls: int = Field(ge=1, le=10_000)
    per_s: float = Field(default=60.0, gt=0, le=3600)


class RateLimit(Rate):
    """At most `calls` calls per `per_s` seconds, per tool and tenant; the tenants named in
    `tenants` have their own rate instead (a bigger customer, a tenant under watch)."""

    tenants: dict[TenantId, Rate] = Field(default_factory=dict)

    def of_tenant(self, tenant: str) -> Rate:
        """The rate that holds for `tenant`."""
        return self.tenants.get(tenant, self)


class PoolSettings(_Strict):
    """How much of a server runs at once: its instances (per tenant or session, by its
    isolation; a shared server has one), the calls in flight on each and on all of them. A
    call beyond waits in a queue, at most `queue_timeout_s`; one that finds the queue full,
    or waits that long, fails as rate limited. A tenant's or a session's instance that no
    call used for `idle_s` is stopped."""

    max_instances: int = Field(default=16, ge=1, le=10_000)
    calls_per_instance: int = Field(default=8, ge=1, le=10_000)
    max_calls: int = Field(default=64, ge=1, le=100_000)
    queue: int = Field(default=128, ge=0, le=100_000)
    queue_timeout_s: float = Field(default=10.0, gt=0, le=600)
    idle_s: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _instance_within_all(self) -> PoolSettings:
        if self.calls_per_instance > self.max_calls:
            raise ValueError(
                f"`calls_per_instance` ({self.calls_per_instance}) is more than `max_calls` "
                f"({self.max_calls}), the calls in flight on all instances together"
            )
        return self


class ToolOverride(_Strict):
    """What the configuration says of one tool, over the server's defaults."""

    risk: Risk | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    # Blank, it would be a permission nobody can hold: refused rather than lock the tool.
    required_permission: str | None = Field(default=None, pattern=r"\S")
    idempotent: bool | None = None
    inverse: ToolInverse | None = None
    effect: ToolEffect | None = None
    action: ToolAction | None = None
    # Its result depends on its arguments only: a session's same call is answered from the
    # log. A call of such a tool changes nothing, so it has no effect and nothing to undo.
    pure: bool = False
    rate_limit: RateLimit | None = None
    trust: Trust | None = None

    @model_validator(mode="after")
    def _pure_changes_nothing(self) -> ToolOverride:
        if self.pure and self.effect not in (None, "none"):
            raise ValueError(f"a pure tool changes nothing: drop `effect: {self.effect}`")
        if self.pure and self.inverse is not None:
            raise ValueError("a pure tool changes nothing, so it has no inverse")
        if self.pure and self.idempotent is False:
            raise ValueError("a pure tool is idempotent: drop `idempotent: false`")
        return self


class ServerConfig(_Strict):
    """One federated MCP server."""

    id: str = Field(pattern=SERVER_ID.pattern)
    stdio: StdioTransport | None = None
    http: HttpTransport | None = None
    # Safe by default: a tool that acts outside Helmline needs a person unless its server's
    # (or its own) configuration says it is less risky.
    risk: Risk = "high"
    # Safe by default too: an MCP tool's results may be anyone's words (a page, a mail, an
    # issue), so calls a model proposes after reading them are tainted, unless declared.
    trust: Trust = "untrusted"
    timeout_s: float = Field(default=30.0, gt=0)
    retries: int = Field(default=2, ge=0, le=10)
    circuit: CircuitSettings = CircuitSettings()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    rate_limit: RateLimit | None = None
    isolation: Isolation = "shared"
    pool: PoolSettings = PoolSettings()
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    sandbox: ServerSandbox = ServerSandbox()
    """What a stdio server may touch; it runs sandboxed even when this is not given."""

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.stdio is None) == (self.http is None):
            raise ValueError("give exactly one of `stdio` or `http`")
        if self.http is not None and "sandbox" in self.model_fields_set:
            raise ValueError("`sandbox` is for stdio servers: the gateway runs no HTTP server")
        return self

    @model_validator(mode="after")
    def _one_shared_instance(self) -> ServerConfig:
        if self.isolation == "shared" and "max_instances" in self.pool.model_fields_set:
            raise ValueError(
                "a shared server runs one instance: drop `pool.max_instances`, or isolate "
                "it per tenant or session (`isolation: tenant` or `session`)"
            )
        return self

    @property
    def transport(self) -> str:
        """`stdio` or `http`."""
        return "stdio" if self.stdio is not None else "http"


class ServersFile(_Strict):
    """The whole file."""

    servers: tuple[ServerConfig, ...] = ()

    @model_validator(mode="after")
    def _distinct_ids(self) -> ServersFile:
        seen: set[str] = set()
        for server in self.servers:
            if server.id in seen:
                raise ValueError(f"server id {server.id!r} is used twice")
            seen.add(server.id)
        return self


def load_servers(path: Path) -> ServersFile:
    """Read and validate an MCP servers file; `YamlFileError` lists every problem by line."""
    source = str(path)
    text = read_text(path, what="MCP servers file")
    document = compose(text, source, expected="`servers`")
    try:
        return ServersFile.model_validate(document.data)
    except ValidationError as error:
        raise YamlFileError(
            source, validation_problems(document.root, error), what="MCP servers file"
        ) from error
