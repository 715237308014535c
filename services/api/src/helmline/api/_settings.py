"""Settings of the API service."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from helmline.runtime import RuntimeSettings


class ApiSettings(RuntimeSettings):
    """Where the public HTTP API listens and how it knows who calls, on top of the runtime's."""

    api_host: str = "127.0.0.1"
    """Interface of the HTTP API."""
    api_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the HTTP API."""
    database_url: str | None = None
    """The state service's read model (PostgreSQL), read for lists across sessions; without
    it, lists are folded from the log."""
    jwks_url: str | None = None
    """JWKS of the OIDC provider whose bearer tokens are accepted; without it, only API keys."""
    jwt_issuer: str | None = None
    """Required `iss` of bearer tokens."""
    jwt_audience: str | None = None
    """Required `aud` of bearer tokens."""
    jwt_tenant_claim: str = "tenant"
    """The claim naming the principal's tenant."""
    jwt_roles_claim: str = "roles"
    """The claim listing the principal's roles (a list, or a space-separated string)."""
    jwt_algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    """Signature algorithms accepted; never `none` or a shared-secret one."""
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest request body accepted, in bytes; a larger one is answered 413 without being
    read whole (an event cannot hold more than 1 MiB anyway)."""
    console_dir: Path | None = None
    """The built web console to serve at `/`; by default the build inside the source tree."""
