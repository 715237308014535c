"""Typed settings shared by every service; each service extends them with its own."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from helmline.runtime._logging import LogFormat


class RuntimeSettings(BaseSettings):
    """What every Helmline process needs to know, from `HELMLINE_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="HELMLINE_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server(s) with JetStream, comma separated."""
    health_host: str = "127.0.0.1"
    """Interface the health endpoints listen on."""
    health_port: int = Field(default=0, ge=0, le=65535)
    """Port of `/healthz` and `/readyz`; 0 picks a free port."""
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    """How long in-flight work may take to finish after SIGTERM."""
    log_level: str = "INFO"
    """Python logging level."""
    events_max_age_s: float | None = Field(default=None, gt=0)
    """How long the events stream keeps events, in seconds; unset keeps them for ever. Set
    the same on every process: each applies it to the stream when it starts."""
    events_max_bytes: int | None = Field(default=None, gt=0)
    """How many bytes the events stream may hold (the oldest go first); unset: no limit."""
    sweep_interval_s: float = Field(default=3600.0, gt=0)
    """With either limit set, how often each service sweeps what it keeps beside the log
    (stored states, tool outputs, workspace snapshots) for sessions the log no longer holds."""
    log_format: LogFormat = "json"
    """`json`: one object per line with session, tenant and trace ids; `text`: for people."""
