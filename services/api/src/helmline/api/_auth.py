"""Who is calling: an API key or an OIDC bearer token, turned into a principal with a tenant.

Every route but health and the console's static files needs a principal; a principal sees
only its own tenant, so another tenant's session is simply not found.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import jwt
import nats.errors
from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from pydantic import TypeAdapter, ValidationError

from helmline.api._keys import (
    KEY_SHAPE,
    LAST_USED_EVERY,
    ROLES,
    UNKNOWN_KEY,
    ApiKeyRecord,
    Role,
    find_api_key,
    looks_like_api_key,
    record_use,
    split_api_key,
)
from helmline.api._problems import Problem, forbidden
from helmline.api._settings import ApiSettings
from helmline.contracts import (
    ALL_API_KEYS,
    Actor,
    ApiKeyCreated,
    ApiKeyRevoked,
    ApiKeyRotated,
    TenantId,
    UndecodableEvent,
    decode_event,
)

logger = logging.getLogger(__name__)

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


class KeyCache:
    """The key records this replica has read, each kept for up to `keep_s`, and forgotten
    as soon as the keys stream says its key was rotated or revoked: a revoked key is
    refused by every replica within the time an event takes to reach it."""

    def __init__(self, js: JetStreamContext, *, keep_s: float = 30.0) -> None:
        self._js = js
        self._keep_s = keep_s
        self._records: dict[str, tuple[ApiKeyRecord, float]] = {}
        # Bumped on every event of a key: a read that began before one is not cached.
        self._changes: dict[str, int] = {}
        self._used: dict[str, datetime] = {}
        self._writes: set[asyncio.Task[None]] = set()
        self._subscription: JetStreamContext.PushSubscription | None = None

    async def follow(self) -> None:
        """Hear every key event from now on (an ordered consumer resumes after a gap)."""

        async def changed(message: Msg) -> None:
            try:
                event = decode_event(message.data)
            except UndecodableEvent as error:
                logger.warning("ignoring an undecodable key event: %s", error)
                return
            if isinstance(event.data, ApiKeyCreated | ApiKeyRotated | ApiKeyRevoked):
                self.forget(event.data.key_id)

        self._subscription = await self._js.subscribe(
            ALL_API_KEYS,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
            cb=changed,
        )

    def forget(self, key_id: str) -> None:
        self._records.pop(key_id, None)
        self._changes[key_id] = self._changes.get(key_id, 0) + 1

    async def get(self, key_id: str) -> ApiKeyRecord | None:
        cached = self._records.get(key_id)
        if cached is not None and time.monotonic() - cached[1] < self._keep_s:
            return cached[0]
        changes = self._changes.get(key_id, 0)
        record = await find_api_key(self._js, key_id)
        if record is not None and self._changes.get(key_id, 0) == changes:
            self._records[key_id] = (record, time.monotonic())
        return record

    def used(self, record: ApiKeyRecord, at: datetime) -> None:
        """Record the key's use, at most once every `LAST_USED_EVERY`, off the request."""
        last = self._used.get(record.key_id)
        if last is not None and at - last < LAST_USED_EVERY:
            return
        self._used[record.key_id] = at
        task = asyncio.create_task(self._record_use(record, at))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _record_use(self, record: ApiKeyRecord, at: datetime) -> None:
        try:
            await record_use(self._js, record, at)
        except (nats.errors.Error, TimeoutError) as error:
            logger.warning("could not record the use of API key %s: %r", record.key_id, error)

    async def close(self) -> None:
        """Stop following; let last-used writes under way finish."""
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
        if self._writes:
            await asyncio.wait(self._writes, timeout=2.0)


class Authenticator:
    """Checks API keys against the key bucket and bearer tokens against the JWKS."""

    def __init__(self, settings: ApiSettings, js: JetStreamContext) -> None:
        self._settings = settings
        self.keys = KeyCache(js)
        self._jwks = (
            jwt.PyJWKClient(settings.jwks_url, cache_keys=True, lifespan=300)
            if settings.jwks_url
            else None
        )

    async def principal(self, credential: str) -> Principal:
        if looks_like_api_key(credential):
            return await self._from_key(credential)
        return await self._from_token(credential)

    async def _from_key(self, key: str) -> Principal:
        parts = split_api_key(key)
        if parts is None:
            raise unauthorized(
                f"the API key is malformed: a key reads {KEY_SHAPE}; check it was copied whole"
            )
        key_id, secret = parts
        record = await self.keys.get(key_id)
        now = datetime.now(UTC)
        refusal = UNKNOWN_KEY if record is None else record.refusal(secret, now)
        if refusal is not None or record is None:
            raise unauthorized(refusal or UNKNOWN_KEY)
        self.keys.used(record, now)
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
Admin = Annotated[Principal, requires("admin")]
