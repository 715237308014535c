"""The key routes: admins list, make, rotate and revoke their tenant's API keys.

Each change is written to the key bucket and published on the keys stream, which every API
replica follows (helmline.api._keys); a secret is in the answer that makes it, and nowhere
else.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from helmline.api._auth import Admin, Authenticator
from helmline.api._keys import (
    DEFAULT_EXPIRY,
    ApiKeyView,
    Permission,
    RevokedApiKey,
    Role,
    UnknownApiKey,
    list_api_keys,
    new_api_key,
    revoke_api_key,
    rotate_api_key,
    store_api_key,
)
from helmline.api._problems import PROBLEM_RESPONSES, ProblemDetails, conflict, not_found
from helmline.contracts import ApiKeyId

router = APIRouter(responses=PROBLEM_RESPONSES, tags=["keys"])

KeyPath = Annotated[ApiKeyId, "the key id (`hlk_<key id>_...`)"]
MAX_EXPIRY_S = 5 * 365 * 24 * 3600
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ProblemDetails, "description": "No such key in the principal's tenant"}
}


class Expiry(BaseModel):
    """How long a key (or its new secret) works."""

    expires_in_s: int | None = Field(
        default=int(DEFAULT_EXPIRY.total_seconds()), gt=0, le=MAX_EXPIRY_S
    )
    """Seconds from now; null: it never expires. 90 days unless said."""

    def expires_in(self) -> timedelta | None:
        return timedelta(seconds=self.expires_in_s) if self.expires_in_s is not None else None


class NewKey(Expiry):
    """A key to make in the admin's own tenant."""

    roles: tuple[Role, ...] = Field(min_length=1)
    """The API roles it holds."""
    permissions: tuple[Permission, ...] = ()
    """Tool permissions it holds beside its roles."""
    name: str = Field(default="", max_length=200)
    """Who or what holds it."""


class Revocation(BaseModel):
    """Why a key is revoked; the body may be left out."""

    reason: str = Field(default="", max_length=2000)
    """In the person's words."""


class MadeKey(ApiKeyView):
    """A key just made or rotated: `key` is shown this once, never again."""

    key: str
    """The whole key, `hlk_<key id>_<secret>`: hand it to its holder now."""


@router.get("/keys")
async def list_keys(principal: Admin, request: Request) -> list[ApiKeyView]:
    """The tenant's API keys, oldest first, revoked and expired ones too; never a secret."""
    return [
        record.shown() for record in await list_api_keys(request.app.state.js, principal.tenant)
    ]


@router.post("/keys", status_code=201)
async def create_key(body: NewKey, principal: Admin, request: Request) -> MadeKey:
    """Make an API key in the admin's tenant (`api.key.created`); its secret is in this
    answer only."""
    key, record = new_api_key(
        principal.tenant,
        body.roles,
        name=body.name,
        permissions=body.permissions,
        expires_in=body.expires_in(),
    )
    await store_api_key(request.app.state.js, record, by=principal.actor())
    return MadeKey(key=key, **record.shown().model_dump())


@router.post("/keys/{key_id}/rotate", responses=NOT_FOUND)
async def rotate_key(
    key_id: KeyPath, principal: Admin, request: Request, body: Expiry | None = None
) -> MadeKey:
    """Give a key a new secret (`api.key.rotated`): the old one is refused from now on, by
    every replica; the new one is in this answer only."""
    expiry = body or Expiry()
    try:
        key, record = await rotate_api_key(
            request.app.state.js,
            key_id,
            by=principal.actor(),
            expires_in=expiry.expires_in(),
            tenant=principal.tenant,
        )
    except UnknownApiKey as error:
        raise not_found(str(error)) from error
    except RevokedApiKey as error:
        raise conflict(str(error)) from error
    _forget_here(request, key_id)
    return MadeKey(key=key, **record.shown().model_dump())


@router.delete("/keys/{key_id}", responses=NOT_FOUND)
async def revoke_key(
    key_id: KeyPath, principal: Admin, request: Request, body: Revocation | None = None
) -> ApiKeyView:
    """Revoke a key for good (`api.key.revoked`): every replica refuses it within a second."""
    try:
        record = await revoke_api_key(
            request.app.state.js,
            key_id,
            by=principal.actor(),
            reason=(body or Revocation()).reason,
            tenant=principal.tenant,
        )
    except UnknownApiKey as error:
        raise not_found(str(error)) from error
    _forget_here(request, key_id)
    return record.shown()


def _forget_here(request: Request, key_id: str) -> None:
    # Other replicas forget the key when its event reaches them; this one must refuse the
    # old secret from its answer on, not from when its own event comes back.
    authenticator: Authenticator = request.app.state.authenticator
    authenticator.keys.forget(key_id)
