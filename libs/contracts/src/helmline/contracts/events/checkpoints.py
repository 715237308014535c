"""Points a session can be rolled back to."""

from __future__ import annotations

from typing import Self

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import STATE
from helmline.contracts._tools import ToolEffect
from helmline.contracts._values import FileChanges, StepId, ToolName
from helmline.contracts.events.tools import InverseCall


class CheckpointCreated(Payload, type="checkpoint.created", published_by=(STATE,)):
    """A point the session can be rolled back to, after a completed step."""

    checkpoint_id: str = Field(min_length=1, max_length=128)
    """Identifies the checkpoint."""
    step_id: StepId
    """The step just completed."""
    call_id: str | None = None
    """The call that completed it."""
    at_seq: int = Field(ge=1)
    """Stream sequence of the event the checkpoint captures the state at."""
    snapshot_id: str | None = None
    """Workspace snapshot taken at that point, if any."""
    reversible: bool = True
    """Whether everything since the previous checkpoint can be undone."""
    compensation: str | None = None
    """How the step is undone (restore the workspace, an inverse tool), or why it cannot be."""
    tool: ToolName | None = None
    """The tool the step called."""
    effect: ToolEffect | None = None
    """What the call changed: nothing, the workspace, or something outside Helmline."""
    inverse: InverseCall | None = None
    """The call that undoes the step, for a tool with a declared inverse."""
    changes: FileChanges | None = None
    """What the step changed in the workspace, when the sandbox ran it."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            checkpoint_id="cp-count.1",
            step_id="count",
            call_id="count.1",
            at_seq=42,
            snapshot_id="snap-7",
            reversible=True,
            compensation="restore the workspace to the previous checkpoint's snapshot",
            tool="run_command",
            effect="workspace",
        )
