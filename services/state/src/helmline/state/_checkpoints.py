"""When a checkpoint is made and what it says. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    CheckpointCreated,
    SessionState,
    ToolCallCompleted,
    ToolEffect,
    ToolSpec,
    WorkspaceSnapshotsPruned,
)


def effect_of(tool: str, tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME) -> ToolEffect:
    """What a call of `tool` changes; a tool nobody describes is taken to reach outside."""
    spec = tools.get(tool)
    return spec.effect if spec is not None else "external"


def checkpoint_after(
    state: SessionState, completed: ToolCallCompleted, seq: int, tools: Mapping[str, ToolSpec]
) -> CheckpointCreated:
    """The checkpoint after a completed step, at the sequence of its completion.

    `state` is the session with the completion applied: the sandbox records the snapshot
    taken after a call before the call's result, so its latest snapshot is this call's.
    `tools` describes the tools (the tool gateway's registry); the checkpoint records what
    it said, so that a rollback later reads the log alone.
    """
    effect = effect_of(completed.tool, tools)
    snapshot = state.latest_snapshot_id
    reversible, how = _how_to_undo(state, completed, effect, snapshot)
    return CheckpointCreated(
        checkpoint_id=f"cp-{completed.call_id}",
        step_id=completed.step_id,
        call_id=completed.call_id,
        at_seq=seq,
        snapshot_id=snapshot,
        reversible=reversible,
        compensation=how,
        tool=completed.tool,
        effect=effect,
        inverse=completed.inverse,
        changes=(
            state.latest_snapshot_changes
            if state.latest_snapshot_call_id == completed.call_id
            else None
        ),
    )


def _how_to_undo(
    state: SessionState, completed: ToolCallCompleted, effect: ToolEffect, snapshot: str | None
) -> tuple[bool, str]:
    match effect:
        case "none":
            return True, "nothing to undo"
        case "workspace":
            return _workspace_undo(state, snapshot)
        case "external" if completed.inverse is not None:
            inverse = completed.inverse
            return True, f"call {inverse.tool} with {inverse.arguments}"
        case "external":
            return False, f"{completed.tool} acts outside Helmline and declares no inverse"


def _workspace_undo(state: SessionState, after: str | None) -> tuple[bool, str]:
    """A workspace change is undone by restoring the snapshot of the previous checkpoint (or
    the workspace as it was before the session's first change)."""
    previous = state.checkpoints[-1].snapshot_id if state.checkpoints else None
    before = previous or state.initial_snapshot_id
    unstored = state.unrestorable_snapshots
    if before is None:
        return False, "the sandbox took no snapshot of the workspace before it"
    if before in unstored:
        return False, f"the workspace before it was not stored: {unstored[before]}"
    how = f"restore the workspace to snapshot {before}"
    if after is not None and after in unstored:
        how += f"; the workspace after it was not stored ({unstored[after]}), so no rollback "
        how += "can return to this checkpoint"
    return True, how


def snapshots_beyond(state: SessionState, kept: int) -> WorkspaceSnapshotsPruned | None:
    """The stored snapshots of the session's checkpoints older than its newest `kept`
    (checkpoints of steps that changed nothing share the snapshot before them). The
    workspace before the session first changed it is kept: a rollback to the start needs it."""
    if state.initial_snapshot_id is None:
        # The sandbox has stored no snapshot of this session's workspace (its tools changed
        # nothing there): none to prune, so its checkpoints need not be looked at (a long
        # session of other tools paid for a walk through all of them at each checkpoint).
        return None
    unstored = state.unrestorable_snapshots
    stored = dict.fromkeys(
        c.snapshot_id
        for c in state.checkpoints
        if c.snapshot_id is not None
        and c.snapshot_id not in unstored
        and c.snapshot_id != state.initial_snapshot_id
    )
    if len(stored) <= kept:
        return None
    return WorkspaceSnapshotsPruned(
        snapshot_ids=tuple(stored)[: len(stored) - kept],
        reason=f"a session keeps its newest {kept} workspace snapshots",
    )
