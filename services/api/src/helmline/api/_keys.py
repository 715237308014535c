"""API keys: made once, shown once, kept only as a hash in a JetStream key-value bucket.

A key reads `hlk_<key id>_<secret>`. The key id names the bucket entry; the secret is 32
random bytes, so a plain SHA-256 of it cannot be guessed back (a slow password hash buys
nothing for a secret with 256 bits of entropy) and a lookup costs one bucket read. The
bucket lives beside the log on JetStream, so every API replica sees the same keys and the
API keeps no store of its own; `helmline keys create` writes to it directly.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Literal

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from helmline.contracts import API_KEYS_BUCKET, TenantId

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


class ApiKeyRecord(BaseModel):
    """What the bucket holds for one key: never the secret, only its SHA-256."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    tenant: TenantId
    roles: tuple[Role, ...] = Field(min_length=1)
    permissions: tuple[Permission, ...] = ()
    name: str = Field(default="", max_length=200)
    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: datetime


def new_api_key(
    tenant: str, roles: Iterable[str], *, name: str = "", permissions: Iterable[str] = ()
) -> tuple[str, ApiKeyRecord]:
    """A fresh key (to hand to its holder once) and the record to store for it.

    Raises pydantic's ValidationError, naming the field, for a bad tenant, role, permission
    or name.
    """
    key_id = secrets.token_hex(KEY_ID_BYTES)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    record = ApiKeyRecord.model_validate(
        {
            "key_id": key_id,
            "tenant": tenant,
            "roles": tuple(dict.fromkeys(roles)),
            "permissions": tuple(dict.fromkeys(permissions)),
            "name": name,
            "secret_sha256": _digest(secret),
            "created_at": datetime.now(UTC),
        }
    )
    return f"{KEY_PREFIX}_{key_id}_{secret}", record


def split_api_key(key: str) -> tuple[str, str] | None:
    """Key id and secret of a string shaped like a key; None for anything else."""
    prefix, _, rest = key.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != KEY_PREFIX or len(key_id) != 2 * KEY_ID_BYTES or not secret:
        return None
    return key_id, secret


def secret_matches(record: ApiKeyRecord, secret: str) -> bool:
    return hmac.compare_digest(record.secret_sha256, _digest(secret))


async def store_api_key(js: JetStreamContext, record: ApiKeyRecord) -> None:
    bucket = await js.key_value(API_KEYS_BUCKET.bucket)
    await bucket.put(record.key_id, record.model_dump_json().encode())


async def find_api_key(js: JetStreamContext, key_id: str) -> ApiKeyRecord | None:
    """The stored record of a key id; None when there is none (or it cannot be read)."""
    bucket = await js.key_value(API_KEYS_BUCKET.bucket)
    try:
        entry = await bucket.get(key_id)
    except KeyNotFoundError:
        return None
    if entry.value is None:
        return None
    try:
        return ApiKeyRecord.model_validate_json(entry.value)
    except ValidationError:
        # A record that does not read is not a key anyone can use.
        return None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
