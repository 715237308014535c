"""Typed settings shared by every service; each service extends them with its own."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from helmline.runtime._logging import LogFormat


def nats_servers(url: str) -> list[str]:
    """The servers of a NATS URL setting, which names a cluster's comma separated."""
    return [server.strip() for server in url.split(",") if server.strip()]


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
    stream_replicas: int = Field(default=1, ge=1, le=5)
    """On how many servers of a NATS cluster each stream and bucket is kept: 3 in production
    (docs/durability.md), 1 on a single server. Set the same on every process: each applies
    it when it starts."""
    sweep_interval_s: float = Field(default=3600.0, gt=0)
    """With either limit set, how often each service sweeps what it keeps beside the log
    (stored states, tool outputs, workspace snapshots) for sessions the log no longer holds."""
    log_format: LogFormat = "json"
    """`json`: one object per line with session, tenant and trace ids; `text`: for people."""
    secrets_key: SecretStr | None = None
    """The key that seals and opens secrets (`helmline secrets`), 32 bytes in
    base64; it is never in NATS nor in the log. Every service needs it: those that run calls
    resolve secrets with it, and all of them redact the values from what they record."""
    secrets_key_file: Path | None = None
    """A file holding that key instead (the embedded stack's is `secrets.key` in its data
    folder, readable by its owner only)."""
    secrets_dir: Path | None = None
    """A folder of secrets' values, a file `<tenant>.<NAME>` each (a Kubernetes Secret
    mounted, the chart's `secretValues`): resolved and redacted like those `helmline secrets
    set` keeps in the bucket (a folder's value wins), and read again as it changes."""
