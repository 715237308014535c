"""When a checkpoint is made and what it says. Pure."""

from __future__ import annotations

from helmline.contracts import CheckpointCreated, ToolCallCompleted

WITHOUT_EFFECT = frozenset({"echo", "read_file", "list_files"})
"""Built-in tools that change nothing, so there is nothing to undo after them."""


def checkpoint_after(completed: ToolCallCompleted, seq: int) -> CheckpointCreated:
    """The checkpoint after a completed step, at the sequence of its completion."""
    reversible = completed.tool in WITHOUT_EFFECT
    how = "nothing to undo" if reversible else "no workspace snapshot or inverse tool yet"
    return CheckpointCreated(
        checkpoint_id=f"cp-{completed.call_id}",
        step_id=completed.step_id,
        call_id=completed.call_id,
        at_seq=seq,
        reversible=reversible,
        compensation=how,
    )
