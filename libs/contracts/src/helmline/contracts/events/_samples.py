"""Values the events' examples share: one session's people, steps and calls."""

from __future__ import annotations

from datetime import UTC, datetime

from helmline.contracts._plans import PlanStep
from helmline.contracts._values import Actor

ANA = Actor(id="ana", kind="user", roles=("operator", "approver"))
POLICY = Actor(id="default-policy", kind="policy")
AT = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
WRITE = PlanStep(
    id="write",
    description="Write the note",
    tool="write_file",
    arguments={"path": "notes.txt", "content": "hello"},
)
COUNT = PlanStep(
    id="count",
    description="Count its bytes",
    tool="run_command",
    arguments={"command": "wc -c notes.txt"},
    depends_on=("write",),
)
CALL = {"call_id": "count.1", "step_id": "count", "tool": "run_command"}
"""The call of step `count`, as the events about it name it."""
UNDO = {"rollback_id": "rb-1", "compensation_id": "undo-write", "step_id": "write"}
"""The compensation that undoes step `write`, as the events about it name it."""
