"""Secrets by reference in the servers file: a stdio server's environment value, or an HTTP
server's header, may be `{secret: NAME}`, resolved from the secret store only when the
server starts (each start reads it anew, so a changed secret takes effect at the next). The
file, the registry and every event keep the reference; the value lives only in the started
process's environment or the HTTP client's headers, and output safety redacts it from logs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from pydantic import BaseModel, ConfigDict, field_validator

from helmline.runtime import SecretsError, check_name

SecretValue = Callable[[str], Awaitable[str]]
"""The value of a secret, by name (raises `SecretsError` when it cannot be had)."""


class SecretReference(BaseModel):
    """`{secret: NAME}`: the value of the secret NAME of the gateway's secrets tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    secret: str

    @field_validator("secret")
    @classmethod
    def _a_secrets_name(cls, name: str) -> str:
        try:
            return check_name(name)
        except SecretsError as error:
            raise ValueError(str(error)) from None


MaybeSecret = str | SecretReference
"""A value written in the file, or a reference to a secret."""


async def resolved(values: Mapping[str, MaybeSecret], value_of: SecretValue) -> dict[str, str]:
    """`values` with each reference replaced by its secret's value."""
    return {
        key: await value_of(value.secret) if isinstance(value, SecretReference) else value
        for key, value in values.items()
    }
