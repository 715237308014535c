"""The tool gateway's settings, from `HELMLINE_*` environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from helmline.runtime import RuntimeSettings


class GatewaySettings(RuntimeSettings):
    """What the tool gateway needs beyond every service's settings."""

    mcp_servers: Path | None = None
    """The MCP servers file (`HELMLINE_MCP_SERVERS`); none federates no server."""
    max_output_bytes: int = Field(default=65536, gt=0)
    """Largest tool output a model is shown, in bytes of JSON; the rest is cut with a marker."""
