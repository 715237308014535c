"""A session's workspace: snapshots stored, restored and pruned."""

from __future__ import annotations

from typing import Self

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import SANDBOX, STATE
from helmline.contracts._values import FileChanges


class WorkspaceSnapshotted(Payload, type="workspace.snapshotted", published_by=(SANDBOX,)):
    """The sandbox stored a snapshot of the session workspace."""

    snapshot_id: str = Field(min_length=1, max_length=128)
    """Names the snapshot in the object store."""
    call_id: str | None = None
    """The call after which it was taken."""
    files: int = Field(default=0, ge=0)
    """Number of files in the workspace."""
    bytes: int = Field(default=0, ge=0)
    """Total size of the workspace."""
    digest: str = ""
    """Digest of the workspace manifest."""
    changes: FileChanges | None = None
    """What the call changed in the workspace (set for a snapshot taken after a call)."""
    irreversible_reason: str | None = None
    """Set when the snapshot's contents could not be stored (above the size cap, or files
    changing while read): the workspace cannot be restored to it, and the step is
    irreversible for that reason."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            snapshot_id="snap-7",
            call_id="write.1",
            files=1,
            bytes=5,
            digest="sha256:2cf24dba5fb0a30e",
        )


class WorkspaceRestored(Payload, type="workspace.restored", published_by=(SANDBOX,)):
    """The sandbox restored the session workspace to a snapshot."""

    snapshot_id: str = Field(min_length=1, max_length=128)
    """The snapshot restored."""
    compensation_id: str | None = None
    """The compensation this restore carries out, during a rollback."""

    @classmethod
    def example(cls) -> Self:
        return cls(snapshot_id="snap-6", compensation_id="undo-write")


class WorkspaceSnapshotsPruned(Payload, type="workspace.snapshots_pruned", published_by=(STATE,)):
    """Snapshots of older checkpoints are no longer kept: the sandbox deletes them, and the
    workspace cannot return to them. The log keeps every checkpoint and what it says."""

    snapshot_ids: tuple[str, ...] = Field(min_length=1)
    """The snapshots dropped."""
    reason: str = Field(min_length=1)
    """Why (the number of checkpoints whose snapshots a session keeps)."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            snapshot_ids=("snap-2", "snap-3"),
            reason="a session keeps its newest 100 workspace snapshots",
        )
