"""The sandbox service's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from helmline.runtime import RuntimeSettings


def _default_workspaces_dir(data: dict[str, Any]) -> Path:
    return Path(data["data_dir"]) / "workspaces"


class SandboxSettings(RuntimeSettings):
    """Where workspaces live, from `HELMLINE_*` environment variables."""

    data_dir: Path = Path(".helmline")
    """The stack's data folder (`HELMLINE_DATA_DIR`, set by `helmline up`)."""
    workspaces_dir: Path = Field(default_factory=_default_workspaces_dir)
    """Root of the session workspaces, `<tenant>/<session_id>/` under it; by default
    `workspaces` in the data folder."""
