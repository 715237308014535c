"""The CLI's settings: one typed object, read from `HELMLINE_*` variables and command options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from helmline.cli._errors import CliError
from helmline.runtime import Durability


class CliSettings(BaseSettings):
    """What the `helmline` command needs to find, start and stop a stack."""

    model_config = SettingsConfigDict(env_prefix="HELMLINE_", extra="ignore", frozen=True)

    data_dir: Path = Path(".helmline")
    """The folder holding the stack's record, logs, NATS store and PostgreSQL data."""

    nats_url: str | None = None
    """An existing NATS server (with JetStream) to use instead of starting one."""

    database_url: str | None = None
    """An existing PostgreSQL database to use instead of starting one."""

    api_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of the HTTP API; a free port is chosen at start when unset."""

    nats_port: int | None = Field(default=None, ge=1, le=65535)
    """Client port of the embedded nats-server; a free port when unset."""

    pg_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of the embedded PostgreSQL; a free port when unset."""

    replicas: int | None = Field(default=None, ge=1, le=8)
    """Processes of every service (`--replicas`); one when unset."""

    nats_cluster: int | None = Field(default=None, ge=1, le=5)
    """Embedded nats-servers forming one JetStream cluster (`--nats-cluster 3`), every stream
    and bucket kept on three of them (R3); one server when unset."""

    durability: Durability = "durable"
    """`durable`: the embedded nats-server fsyncs every append before acknowledging it;
    `relaxed`: faster, but a power loss, kernel crash or VM reset loses up to ~2 minutes of
    acknowledged events (docs/durability.md). An external NATS keeps its own setting."""

    startup_timeout: float = Field(default=60.0, gt=0)
    """Seconds `up` waits for every component to become ready."""

    stop_grace: float = Field(default=10.0, gt=0)
    """Seconds `down` gives a process after SIGTERM before it sends SIGKILL."""

    secrets_key: SecretStr | None = None
    """The key secrets are sealed with, instead of the data folder's `secrets.key`."""

    secrets_key_file: Path | None = None
    """A file holding that key, instead of the data folder's `secrets.key`."""

    sealing_key: SecretStr | None = None
    """The key the tool gateway seals raw outputs with (base64), to read them back."""

    sealing_key_file: Path | None = None
    """A file holding it; by default the data folder's `sealing.key`, which `up` makes."""

    def resolved_data_dir(self) -> Path:
        # Child processes run with other working directories, so they get an absolute path.
        return self.data_dir.expanduser().resolve()


def load_settings(**overrides: Any) -> CliSettings:
    """Settings from the environment, with the command line's options (those given) on top."""
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return CliSettings(**given)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise CliError(f"invalid settings (options or HELMLINE_* variables): {problems}") from error
