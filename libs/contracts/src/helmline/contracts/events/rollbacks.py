"""Rollbacks to a checkpoint, and the compensations that undo steps one by one."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import API, SANDBOX, STATE
from helmline.contracts._values import Actor, Arguments, StepId, ToolError, ToolName
from helmline.contracts.events._samples import ANA, UNDO


class RollbackRequested(Payload, type="rollback.requested", published_by=(API,)):
    """Someone asked to roll the session back to a checkpoint."""

    rollback_id: str = Field(min_length=1, max_length=128)
    """Identifies this rollback."""
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The checkpoint to return to."""
    requested_by: Actor
    """Who asked."""
    accept_partial: bool = False
    """Roll back what can be undone even if some steps are irreversible."""
    reason: str = ""
    """Why."""

    @classmethod
    def example(cls) -> Self:
        return cls(rollback_id="rb-1", checkpoint_id="cp-write.1", requested_by=ANA)


class RollbackRefused(Payload, type="rollback.refused", published_by=(STATE,)):
    """A rollback was refused up front; nothing was undone."""

    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback refused."""
    reason: str
    """Why."""
    blocking_steps: tuple[StepId, ...] = ()
    """Irreversible steps that stand in the way."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            rollback_id="rb-1", reason="step 'deploy' cannot be undone", blocking_steps=("deploy",)
        )


class CompensationScheduled(Payload, type="compensation.scheduled", published_by=(STATE,)):
    """One undo action of a rollback is to run."""

    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback it belongs to."""
    compensation_id: str = Field(min_length=1, max_length=128)
    """Identifies this compensation."""
    step_id: StepId
    """The step it undoes."""
    kind: Literal["restore_workspace", "inverse_tool"]
    """Restore a workspace snapshot, or call the tool's declared inverse."""
    snapshot_id: str | None = None
    """The snapshot to restore, for `restore_workspace`."""
    tool: ToolName | None = None
    """The inverse tool, for `inverse_tool`."""
    arguments: Arguments | None = None
    """The inverse tool's arguments."""
    steps: tuple[StepId, ...] = ()
    """Every step it undoes, when more than `step_id`: one workspace restore undoes every
    workspace change after the checkpoint."""

    @classmethod
    def example(cls) -> Self:
        return cls(**UNDO, kind="restore_workspace", snapshot_id="snap-6")


# The sandbox ends the workspace restores, the state service the undo calls.
class CompensationCompleted(Payload, type="compensation.completed", published_by=(STATE, SANDBOX)):
    """An undo action finished."""

    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback it belongs to."""
    compensation_id: str = Field(min_length=1, max_length=128)
    """The compensation."""
    step_id: StepId
    """The step undone."""
    steps: tuple[StepId, ...] = ()
    """Every step undone, when more than `step_id` (see `compensation.scheduled`)."""

    @classmethod
    def example(cls) -> Self:
        return cls(**UNDO)


# The sandbox ends the workspace restores, the state service the undo calls.
class CompensationFailed(Payload, type="compensation.failed", published_by=(STATE, SANDBOX)):
    """An undo action failed."""

    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback it belongs to."""
    compensation_id: str = Field(min_length=1, max_length=128)
    """The compensation."""
    step_id: StepId
    """The step that could not be undone."""
    error: ToolError
    """What went wrong."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            **UNDO,
            error=ToolError(
                kind="unavailable", message="snapshot store unreachable", retryable=True
            ),
        )


class RollbackCompleted(Payload, type="rollback.completed", published_by=(STATE,)):
    """The session is back at the checkpoint (plus the record of the rollback)."""

    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback."""
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The checkpoint returned to."""
    undone_steps: tuple[StepId, ...] = ()
    """Steps undone, in the order they were undone."""
    not_undone_steps: tuple[StepId, ...] = ()
    """Irreversible steps left as they were, in a partial rollback the requester accepted."""

    @classmethod
    def example(cls) -> Self:
        return cls(rollback_id="rb-1", checkpoint_id="cp-write.1", undone_steps=("count",))


class RollbackFailed(Payload, type="rollback.failed", published_by=(STATE,)):
    """A rollback stopped before reaching its checkpoint."""

    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback."""
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The checkpoint it aimed for."""
    reason: str
    """Why it stopped."""
    undone_steps: tuple[StepId, ...] = ()
    """Steps that were undone."""
    not_undone_steps: tuple[StepId, ...] = ()
    """Steps that were not."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            rollback_id="rb-1",
            checkpoint_id="cp-write.1",
            reason="an undo failed",
            undone_steps=("count",),
            not_undone_steps=("write",),
        )
