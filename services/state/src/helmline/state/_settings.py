"""Settings of the state service."""

from __future__ import annotations

from helmline.runtime import RuntimeSettings


class StateSettings(RuntimeSettings):
    """Where the read model lives, on top of the runtime settings."""

    database_url: str | None = None
    """PostgreSQL for the read model (HELMLINE_DATABASE_URL); without it no read model is kept."""
