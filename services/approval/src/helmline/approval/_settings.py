"""The approval service's settings, from `HELMLINE_*` environment variables."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field

from helmline.runtime import RuntimeSettings


class ApprovalSettings(RuntimeSettings):
    """What the approval service needs beyond what every service needs."""

    policy: Path | None = None
    """The policy file (HELMLINE_POLICY); the built-in default policy when unset."""
    policy_poll_s: float = Field(default=1.0, gt=0)
    """How often the policy file is checked for changes."""
    webhook_secrets: dict[str, str] = Field(default_factory=dict, repr=False)
    """Signing secrets of the policy's webhooks by name (HELMLINE_WEBHOOK_SECRETS, JSON)."""
    expiry_lookback: timedelta = Field(default=timedelta(days=7), gt=timedelta(0))
    """How far back a restart looks for approval requests whose expiry must be watched;
    requests older than this are left alone (keep it above the longest expiry in use)."""
