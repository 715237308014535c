"""What the state service lets wait for a gathering of checkpoints, and what it handles at
once."""

from __future__ import annotations

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    Actor,
    Payload,
    RollbackRequested,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolError,
    WorkspaceSnapshotted,
)
from helmline.runtime import EventStore, FoldedStates
from helmline.runtime.testing import session_started
from helmline.state._handlers import StateHandler
from helmline.state._rollback import compensation_step_id
from helmline.state._settings import StateSettings

UNDO = compensation_step_id("write")
FAILURE = ToolError(kind="execution", message="exit 1", retryable=False)


@pytest.mark.parametrize(
    ("payload", "may_wait"),
    [
        (ToolCallCompleted(call_id="c", step_id="write", tool="write_file"), True),
        (ToolCallFailed(call_id="c", step_id="write", tool="write_file", error=FAILURE), True),
        (ToolCallDenied(call_id="c", step_id="write", tool="write_file", reason="no"), True),
        (WorkspaceSnapshotted(snapshot_id="s", call_id="c"), True),
        # What takes a rollback further does not wait.
        (ToolCallCompleted(call_id="u", step_id=UNDO, tool="write_file"), False),
        (ToolCallFailed(call_id="u", step_id=UNDO, tool="write_file", error=FAILURE), False),
        (ToolCallDenied(call_id="u", step_id=UNDO, tool="write_file", reason="no"), False),
        (RollbackRequested(rollback_id="r", checkpoint_id="c", requested_by=Actor(id="a")), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Payload) else str(value),
)
def test_a_plan_step_s_outcome_may_wait_and_a_rollback_s_may_not(
    payload: Payload, may_wait: bool, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    handler = StateHandler(
        store,
        BUILTIN_TOOLS_BY_NAME,
        FoldedStates(js, store),
        snapshots_kept=StateSettings().snapshots_kept,
    )
    event = session_started(tenant).derive(payload, source="test")
    assert handler.may_wait(event) is may_wait
