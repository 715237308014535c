"""The CLI's settings: one typed object, read from `HELMLINE_*` variables and command options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    startup_timeout: float = Field(default=60.0, gt=0)
    """Seconds `up` waits for every component to become ready."""

    stop_grace: float = Field(default=10.0, gt=0)
    """Seconds `down` gives a process after SIGTERM before it sends SIGKILL."""

    def resolved_data_dir(self) -> Path:
        # Child processes run with other working directories, so they get an absolute path.
        return self.data_dir.expanduser().resolve()


def load_settings(**overrides: Any) -> CliSettings:
    """Settings from the environment, with the command line's options (those given) on top."""
    given = {name: value for name, value in overrides.items() if value is not None}
    return CliSettings(**given)
