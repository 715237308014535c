"""Settings of the API service."""

from __future__ import annotations

from pydantic import Field

from helmline.runtime import RuntimeSettings


class ApiSettings(RuntimeSettings):
    """Where the public HTTP API listens, on top of the runtime settings."""

    api_host: str = "127.0.0.1"
    """Interface of the HTTP API."""
    api_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the HTTP API."""
