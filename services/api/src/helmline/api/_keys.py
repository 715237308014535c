"""API keys: made once, shown once, kept only as a hash in a JetStream key-value bucket.

A key reads `hlk_<key id>_<secret>`. The key id names the bucket entry; the secret is 32
random bytes, so a plain SHA-256 of it cannot be guessed back (a slow password hash buys
nothing for a secret with 256 bits of entropy) and a lookup costs one bucket read. The
bucket lives beside the log on JetStream, so every API replica sees the same keys and the
API keeps no store of its own; `helmline keys` writes to it directly.

Making, rotating and revoking a key writes the bucket first (what a request is checked
against), then publishes the fact on the keys stream (`api.key.*`, never the secret): every
API replica follows that stream and forgets what it cached of the key at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from helmline.contracts import (
    API_KEYS_BUCKET,
    KEYS_SESSION,
    KEYS_STREAM,
    Actor,
    ApiKeyCreated,
    ApiKeyRevoked,
    ApiKeyRotated,
    Headers,
    Payload,
    TenantId,
    api_key_subject,
    encode_event,
    new_event,
    source_of,
)

Role = Literal["viewer", "operator", "approver", "admin"]
"""What a principal may do: viewers read; operators also start, steer, roll back and fork
sessions; approvers also decide approval requests; admins may do all of it."""

ROLES: tuple[Role, ...] = ("viewer", "operator", "approver", "admin")


def _not_a_role(name: str) -> str:
    if name in ROLES:
        raise ValueError(f"{name!r} is one of the API's roles, not a permission: use --role")
    return name


Permission = Annotated[str, Field(pattern=r"^\S+$", max_length=100), AfterValidator(_not_a_role)]
"""A permission a tool may require (`required_permission` in the MCP servers file), held
beside the roles: it grants none of the API's rights, only calls of such tools."""

KEY_PREFIX = "hlk"
KEY_ID_BYTES = 8
SECRET_BYTES = 32
KEY_SHAPE = "hlk_<16 hex digits>_<43 letters, digits, - or _>"
_KEY = re.compile(r"^hlk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_KEY_ID = re.compile(r"[0-9a-f]{16}")

DEFAULT_EXPIRY = timedelta(days=90)
"""How long a key works unless its maker says otherwise (`--expires-in`, `expires_in_s`)."""

LAST_USED_EVERY = timedelta(minutes=1)
"""How often each API replica records a key's last use, at most: a request does not wait
on a write, and a busy key costs one write a minute, not one a request."""

SOURCE = source_of("api")


class ApiKeyView(BaseModel):
    """An API key as people may see it: never its secret, nor the secret's hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    """The key's public part (`hlk_<key id>_...`): names it, grants nothing."""
    tenant: TenantId
    """The tenant it acts in."""
    roles: tuple[Role, ...] = Field(min_length=1)
    """The API roles it holds."""
    permissions: tuple[Permission, ...] = ()
    """Tool permissions it holds beside its roles."""
    name: str = Field(default="", max_length=200)
    """Who or what holds it."""
    created_at: datetime
    """When it was made."""
    expires_at: datetime | None = None
    """When it stops working; None: never (keys made before keys expired)."""
    rotated_at: datetime | None = None
    """When it was last given a new secret."""
    revoked_at: datetime | None = None
    """When it was revoked: it never works again."""
    last_used_at: datetime | None = None
    """When a request last used it, to the minute (see `LAST_USED_EVERY`)."""


class ApiKeyRecord(ApiKeyView):
    """What the bucket holds for one key: never the secret, only its SHA-256."""

    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    def refusal(self, secret: str, now: datetime) -> str | None:
        """Why a request with this key and `secret` is refused; None when it is not."""
        if not secret_matches(self, secret):
            return UNKNOWN_KEY
        if self.revoked_at is not None:
            return f"the API key {self.key_id} was revoked at {self.revoked_at:%Y-%m-%d %H:%M} UTC"
        if self.expires_at is not None and now >= self.expires_at:
            return f"the API key {self.key_id} expired at {self.expires_at:%Y-%m-%d %H:%M} UTC"
        return None

    def shown(self) -> ApiKeyView:
        """The record as people may see it: everything but the secret's hash."""
        return ApiKeyView.model_validate(self.model_dump(exclude={"secret_sha256"}))


UNKNOWN_KEY = "the API key is not known (or was mistyped)"


class ApiKeyError(Exception):
    """A key cannot be changed as asked."""


class UnknownApiKey(ApiKeyError):
    """No such key (in the tenant asked about)."""


class RevokedApiKey(ApiKeyError):
    """The key is revoked; it cannot be rotated."""


def new_api_key(
    tenant: str,
    roles: Iterable[str],
    *,
    name: str = "",
    permissions: Iterable[str] = (),
    expires_in: timedelta | None = DEFAULT_EXPIRY,
) -> tuple[str, ApiKeyRecord]:
    """A fresh key (to hand to its holder once) and the record to store for it; it expires
    `expires_in` from now (None: never).

    Raises pydantic's ValidationError, naming the field, for a bad tenant, role, permission
    or name.
    """
    key_id = secrets.token_hex(KEY_ID_BYTES)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    now = datetime.now(UTC)
    record = ApiKeyRecord.model_validate(
        {
            "key_id": key_id,
            "tenant": tenant,
            "roles": tuple(dict.fromkeys(roles)),
            "permissions": tuple(dict.fromkeys(permissions)),
            "name": name,
            "secret_sha256": _digest(secret),
            "created_at": now,
            "expires_at": now + expires_in if expires_in is not None else None,
        }
    )
    return f"{KEY_PREFIX}_{key_id}_{secret}", record


def looks_like_api_key(credential: str) -> bool:
    """Whether a credential is meant as an API key (rather than a bearer token)."""
    return credential.startswith(f"{KEY_PREFIX}_")


def split_api_key(key: str) -> tuple[str, str] | None:
    """Key id and secret of a string shaped like a key; None for anything else."""
    match = _KEY.match(key)
    return (match[1], match[2]) if match else None


def secret_matches(record: ApiKeyRecord, secret: str) -> bool:
    return hmac.compare_digest(record.secret_sha256, _digest(secret))


async def store_api_key(js: JetStreamContext, record: ApiKeyRecord, *, by: Actor) -> None:
    """Keep a new key and publish `api.key.created`."""
    bucket = await js.key_value(API_KEYS_BUCKET.bucket)
    await bucket.put(record.key_id, record.model_dump_json().encode())
    await _publish(
        js,
        record,
        ApiKeyCreated(
            key_id=record.key_id,
            tenant=record.tenant,
            roles=record.roles,
            permissions=record.permissions,
            name=record.name,
            expires_at=record.expires_at,
            by=by,
        ),
    )


async def find_api_key(js: JetStreamContext, key_id: str) -> ApiKeyRecord | None:
    """The stored record of a key id; None when there is none (or it cannot be read)."""
    found = await _read(js, key_id)
    return found[0] if found is not None else None


async def list_api_keys(js: JetStreamContext, tenant: str | None = None) -> list[ApiKeyRecord]:
    """Every key (of one tenant, or of all), oldest first."""
    bucket = await js.key_value(API_KEYS_BUCKET.bucket)
    try:
        key_ids = await bucket.keys()
    except NoKeysError:
        return []
    records = [await find_api_key(js, key_id) for key_id in key_ids]
    return sorted(
        (r for r in records if r is not None and tenant in (None, r.tenant)),
        key=lambda record: record.created_at,
    )


async def rotate_api_key(
    js: JetStreamContext,
    key_id: str,
    *,
    by: Actor,
    expires_in: timedelta | None = DEFAULT_EXPIRY,
    tenant: str | None = None,
) -> tuple[str, ApiKeyRecord]:
    """Give a key a new secret (the old one is refused from now on) and publish
    `api.key.rotated`; the new key, to hand over once, and its record."""
    secret = secrets.token_urlsafe(SECRET_BYTES)

    def rotated(record: ApiKeyRecord, now: datetime) -> ApiKeyRecord:
        if record.revoked_at is not None:
            raise RevokedApiKey(f"the API key {key_id} is revoked: make a new one")
        return record.model_copy(
            update={
                "secret_sha256": _digest(secret),
                "rotated_at": now,
                "expires_at": now + expires_in if expires_in is not None else None,
            }
        )

    record = await _change(js, key_id, tenant, rotated)
    await _publish(
        js,
        record,
        ApiKeyRotated(key_id=key_id, tenant=record.tenant, expires_at=record.expires_at, by=by),
    )
    return f"{KEY_PREFIX}_{key_id}_{secret}", record


async def revoke_api_key(
    js: JetStreamContext, key_id: str, *, by: Actor, reason: str = "", tenant: str | None = None
) -> ApiKeyRecord:
    """Revoke a key for good and publish `api.key.revoked` (again, if it already was: a
    replica that missed the first hears it now)."""

    def revoked(record: ApiKeyRecord, now: datetime) -> ApiKeyRecord:
        return record.model_copy(update={"revoked_at": record.revoked_at or now})

    record = await _change(js, key_id, tenant, revoked)
    await _publish(
        js, record, ApiKeyRevoked(key_id=key_id, tenant=record.tenant, reason=reason, by=by)
    )
    return record


async def record_use(js: JetStreamContext, record: ApiKeyRecord, at: datetime) -> None:
    """Note that the key was used at `at`, unless it changed meanwhile (a rotation or a
    revocation always wins over a last-used time)."""
    bucket = await js.key_value(API_KEYS_BUCKET.bucket)
    found = await _read(js, record.key_id)
    if found is None or found[0].secret_sha256 != record.secret_sha256:
        return
    stored, revision = found
    used = stored.model_copy(update={"last_used_at": at})
    # Changed since it was read: the next use records its time.
    with contextlib.suppress(KeyWrongLastSequenceError):
        await bucket.update(record.key_id, used.model_dump_json().encode(), last=revision)


async def _read(js: JetStreamContext, key_id: str) -> tuple[ApiKeyRecord, int] | None:
    if not _KEY_ID.fullmatch(key_id):
        return None  # Not a key id, so no bucket key: nothing to look up.
    bucket = await js.key_value(API_KEYS_BUCKET.bucket)
    try:
        entry = await bucket.get(key_id)
    except KeyNotFoundError:
        return None
    if entry.value is None or entry.revision is None:
        return None
    try:
        return ApiKeyRecord.model_validate_json(entry.value), entry.revision
    except ValidationError:
        # A record that does not read is not a key anyone can use.
        return None


async def _change(
    js: JetStreamContext,
    key_id: str,
    tenant: str | None,
    change: Callable[[ApiKeyRecord, datetime], ApiKeyRecord],
) -> ApiKeyRecord:
    """Apply `change` to a key's record, again on a concurrent write (a last-used time)."""
    bucket = await js.key_value(API_KEYS_BUCKET.bucket)
    while True:
        found = await _read(js, key_id)
        if found is None or tenant not in (None, found[0].tenant):
            raise UnknownApiKey(f"no API key {key_id}" + (f" in tenant {tenant}" if tenant else ""))
        record, revision = found
        changed = change(record, datetime.now(UTC))
        try:
            await bucket.update(key_id, changed.model_dump_json().encode(), last=revision)
        except KeyWrongLastSequenceError:
            continue
        return changed


async def _publish(js: JetStreamContext, record: ApiKeyRecord, payload: Payload) -> None:
    event = new_event(payload, tenant=record.tenant, session_id=KEYS_SESSION, source=SOURCE)
    await js.publish(
        api_key_subject(record.tenant, record.key_id),
        encode_event(event),
        stream=KEYS_STREAM.name,
        headers={Headers.MSG_ID: str(event.id)},
    )


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
