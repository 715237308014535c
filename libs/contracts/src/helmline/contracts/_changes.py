"""What an event changes in its session's state: the steps, approvals and checkpoints it
names, or all of them. Pure; what the read model rewrites and what the API's "changes since
a sequence" answers with."""

from __future__ import annotations

from dataclasses import dataclass

from helmline.contracts._payload import Payload
from helmline.contracts.events import (
    PlanProposed,
    RollbackCompleted,
    SessionCancelled,
    SessionCompleted,
    SessionFailed,
    SessionStarted,
)


@dataclass(frozen=True, slots=True)
class Touched:
    """Which rows of a session an event can change, besides the session's own."""

    steps: tuple[str, ...] = ()
    approvals: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    every_row: bool = False

    def __or__(self, other: Touched) -> Touched:
        """The rows either changes."""
        return Touched(
            self.steps + other.steps,
            self.approvals + other.approvals,
            self.checkpoints + other.checkpoints,
            self.every_row or other.every_row,
        )


EVERY_ROW = Touched(every_row=True)


def touched(payload: Payload) -> Touched:
    """The rows (steps, approvals, checkpoints) an event changes: those it names, or all of
    them for a session's start (a fork's marks the steps completed before the fork), plans,
    rollbacks and a session's end (which withdraws every request still pending)."""
    ends = SessionCompleted | SessionFailed | SessionCancelled
    if isinstance(payload, SessionStarted | PlanProposed | RollbackCompleted | ends):
        return EVERY_ROW
    # A compensation names every step it undoes besides the latest.
    step_ids = (getattr(payload, "step_id", None), *getattr(payload, "steps", ()))
    request_id = getattr(payload, "request_id", None)
    checkpoint_id = getattr(payload, "checkpoint_id", None)
    return Touched(
        steps=tuple(step_id for step_id in step_ids if isinstance(step_id, str)),
        approvals=(request_id,) if isinstance(request_id, str) else (),
        checkpoints=(checkpoint_id,) if isinstance(checkpoint_id, str) else (),
    )
