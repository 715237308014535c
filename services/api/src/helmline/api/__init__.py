"""Helmline API service: the HTTP API and web console; user intents become events.

Importing the package is light (no web framework): `helmline keys` uses the key functions.
"""

from helmline.api._keys import (
    DEFAULT_EXPIRY,
    ROLES,
    ApiKeyError,
    ApiKeyRecord,
    ApiKeyView,
    RevokedApiKey,
    Role,
    UnknownApiKey,
    find_api_key,
    list_api_keys,
    new_api_key,
    revoke_api_key,
    rotate_api_key,
    split_api_key,
    store_api_key,
)

__all__ = [
    "DEFAULT_EXPIRY",
    "ROLES",
    "ApiKeyError",
    "ApiKeyRecord",
    "ApiKeyView",
    "RevokedApiKey",
    "Role",
    "UnknownApiKey",
    "find_api_key",
    "list_api_keys",
    "new_api_key",
    "revoke_api_key",
    "rotate_api_key",
    "split_api_key",
    "store_api_key",
]
