"""API keys made, rotated and revoked.

Facts about credentials, which belong to no session: they live on the keys stream, where every
API replica follows them. The secret is never in an event (only its holder has it; the key
bucket keeps its SHA-256). The API appends them; the CLI makes keys as NATS admin.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Self, TypeAlias

from pydantic import Field, StringConstraints

from helmline.contracts._payload import Payload
from helmline.contracts._services import API
from helmline.contracts._values import Actor, TenantId

ApiKeyId: TypeAlias = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
"""The public part of an API key (`hlk_<key id>_<secret>`): it names the key, grants nothing."""

# The key and the person of the examples.
_KEY = {"key_id": "3f9a6c0d2b7e4158", "tenant": "acme"}
_ADMIN = Actor(id="ana", roles=("admin",))


class ApiKeyCreated(Payload, type="api.key.created", published_by=(API,)):
    """An API key was made for a tenant, with roles, until an expiry."""

    key_id: ApiKeyId
    """The key."""
    tenant: TenantId
    """The tenant it acts in."""
    roles: tuple[str, ...] = Field(min_length=1)
    """The API roles it holds."""
    permissions: tuple[str, ...] = ()
    """Tool permissions it holds beside its roles."""
    name: str = Field(default="", max_length=200)
    """Who or what holds it, for the record."""
    expires_at: datetime | None = None
    """When it stops working; None: never."""
    by: Actor
    """Who made it."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            **_KEY,
            roles=("operator",),
            permissions=("repo.write",),
            name="ci",
            expires_at=datetime(2026, 6, 1, 9, 30, tzinfo=UTC),
            by=_ADMIN,
        )


class ApiKeyRotated(Payload, type="api.key.rotated", published_by=(API,)):
    """An API key was given a new secret: the old one is refused from now on."""

    key_id: ApiKeyId
    """The key, which keeps its id, tenant and roles."""
    tenant: TenantId
    """The tenant it acts in."""
    expires_at: datetime | None = None
    """When the new secret stops working; None: never."""
    by: Actor
    """Who rotated it."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            **_KEY,
            expires_at=datetime(2026, 9, 1, 9, 30, tzinfo=UTC),
            by=_ADMIN,
        )


class ApiKeyRevoked(Payload, type="api.key.revoked", published_by=(API,)):
    """An API key was revoked: every API replica refuses it from now on, for good."""

    key_id: ApiKeyId
    """The key."""
    tenant: TenantId
    """The tenant it acted in."""
    reason: str = Field(default="", max_length=2000)
    """Why, in the person's words."""
    by: Actor
    """Who revoked it."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            **_KEY,
            reason="the CI runner's disk was shared",
            by=_ADMIN,
        )
