"""Settings of the state service."""

from __future__ import annotations

from pydantic import Field

from helmline.runtime import RuntimeSettings


class StateSettings(RuntimeSettings):
    """Where the read model lives and when to warn about retention, on top of the runtime
    settings."""

    database_url: str | None = None
    """PostgreSQL for the read model (HELMLINE_DATABASE_URL); without it no read model is kept."""
    retention_warn_at: float = Field(default=0.8, gt=0, le=1)
    """Share of the events stream's age or bytes limit at which `stream.limit_approaching`
    is published (HELMLINE_RETENTION_WARN_AT)."""
    retention_check_s: float = Field(default=60.0, gt=0)
    """How often the events stream's limits are checked (HELMLINE_RETENTION_CHECK_S)."""
    snapshots_kept: int = Field(default=100, ge=1)
    """Workspace snapshots of a session's checkpoints kept, the newest ones; older ones are
    pruned (`workspace.snapshots_pruned`) while their checkpoints stay in the log, and the
    workspace as it was before the session first changed it is always kept
    (HELMLINE_SNAPSHOTS_KEPT)."""
    waiting_check_s: float = Field(default=15.0, gt=0)
    """How often the sessions not ended and the approval requests waiting are counted in the
    read model, for the `helmline_sessions_open` and `helmline_approvals_waiting` metrics
    (HELMLINE_WAITING_CHECK_S)."""
