"""Helmline API service: the HTTP API and web console; user intents become events.

Importing the package is light (no web framework): `helmline keys` uses the key functions.
"""

from helmline.api._keys import (
    ROLES,
    ApiKeyRecord,
    Role,
    find_api_key,
    new_api_key,
    split_api_key,
    store_api_key,
)

__all__ = [
    "ROLES",
    "ApiKeyRecord",
    "Role",
    "find_api_key",
    "new_api_key",
    "split_api_key",
    "store_api_key",
]
