"""Who is calling: an API key or an OIDC bearer token, turned into a principal with a tenant.

Every route but health and the console's static files needs a principal; a principal sees
only its own tenant, so another tenant's session is simply not found.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any

import jwt
from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from nats.js import JetStreamContext
from pydantic import TypeAdapter, ValidationError

from helmline.api._keys import ROLES, Role, find_api_key, secret_matches, split_api_key
from helmline.api._problems import Problem, forbidden
from helmline.api._settings import ApiSettings
from helmline.contracts import Actor, TenantId

_TENANT = TypeAdapter[str](TenantId)

GRANTED_BY: dict[Role, frozenset[str]] = {
    "viewer": frozenset(ROLES),
    "operator": frozenset({"operator", "admin"}),
    "approver": frozenset({"approver", "admin"}),
    "admin": frozenset({"admin"}),
}
"""Which held roles grant each role's rights: admins may do everything, anyone may look."""


@dataclass(frozen=True)
class Principal:
    """Who is calling, in which tenant, with which roles."""

    id: str
    tenant: str
    roles: frozenset[str]

    def has(self, role: Role) -> bool:
        return not self.roles.isdisjoint(GRANTED_BY[role])

    def actor(self) -> Actor:
        """The principal as events record it; an admin acts with every role."""
        held = set(self.roles) | (set(ROLES) if "admin" in self.roles else set())
        return Actor(id=self.id, kind="user", roles=tuple(sorted(held)))


class Authenticator:
    """Checks API keys against the key bucket and bearer tokens against the JWKS."""

    def __init__(self, settings: ApiSettings, js: JetStreamContext) -> None:
        self._settings = settings
        self._js = js
        self._jwks = (
            jwt.PyJWKClient(settings.jwks_url, cache_keys=True, lifespan=300)
            if settings.jwks_url
            else None
        )

    async def principal(self, credential: str) -> Principal:
        if split_api_key(credential) is not None:
            return await self._from_key(credential)
        return await self._from_token(credential)

    async def _from_key(self, key: str) -> Principal:
        parts = split_api_key(key)
        assert parts is not None
        key_id, secret = parts
        record = await find_api_key(self._js, key_id)
        if record is None or not secret_matches(record, secret):
            raise unauthorized("the API key is not known (or was mistyped)")
        # Permissions travel with the roles into the sessions the key starts, where the
        # approval service checks tools' required permissions; they grant no API right.
        held = frozenset(record.roles) | frozenset(record.permissions)
        return Principal(id=f"key:{record.name or key_id}", tenant=record.tenant, roles=held)

    async def _from_token(self, token: str) -> Principal:
        if self._jwks is None:
            raise unauthorized("bearer tokens are not accepted here: no JWKS is configured")
        settings = self._settings
        try:
            # PyJWKClient fetches with urllib; keep the event loop free while it does.
            signing = await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)
            claims: dict[str, Any] = jwt.decode(
                token,
                signing.key,
                algorithms=list(settings.jwt_algorithms),
                audience=settings.jwt_audience,
                issuer=settings.jwt_issuer,
                options={"require": ["exp", "sub"]},
            )
        except jwt.PyJWTError as error:
            raise unauthorized(f"the bearer token was refused: {error}") from error
        try:
            tenant = _TENANT.validate_python(claims.get(settings.jwt_tenant_claim))
        except ValidationError as error:
            raise unauthorized(
                f"the token's {settings.jwt_tenant_claim!r} claim names no valid tenant"
            ) from error
        roles = claims.get(settings.jwt_roles_claim, [])
        if isinstance(roles, str):
            roles = roles.split()
        if not isinstance(roles, list) or not all(isinstance(role, str) for role in roles):
            raise unauthorized(f"the token's {settings.jwt_roles_claim!r} claim is not a list")
        return Principal(id=str(claims["sub"]), tenant=tenant, roles=frozenset(roles))


def unauthorized(detail: str) -> Problem:
    return Problem(401, "Unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


_bearer = HTTPBearer(auto_error=False, description="An API key (hlk_...) or an OIDC token")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="An API key")


async def authenticated(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    credential = bearer.credentials if bearer is not None else api_key
    if not credential:
        raise unauthorized("send an API key or token: `Authorization: Bearer <key or token>`")
    authenticator: Authenticator = request.app.state.authenticator
    return await authenticator.principal(credential)


def requires(role: Role) -> Any:
    """A dependency giving the principal, refusing one whose roles do not grant `role`."""

    async def check(principal: Annotated[Principal, Depends(authenticated)]) -> Principal:
        if not principal.has(role):
            raise forbidden(
                f"this needs the {role} role; {principal.id} holds "
                f"{', '.join(sorted(principal.roles)) or 'no role'}"
            )
        return principal

    return Depends(check)


Viewer = Annotated[Principal, requires("viewer")]
Operator = Annotated[Principal, requires("operator")]
Approver = Annotated[Principal, requires("approver")]
